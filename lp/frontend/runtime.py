"""The Python API: load a model once per rank, then generate many times.

    from lp import LP
    lm = LP("smollm2-135m")
    r = lm.generate("Write a haiku about GPUs.", chat=True, max_new_tokens=64)  # W=N=G="auto"
    print(r.text, r.S, r.tokens_per_s)
    lm.generate("A poem about the sea.", chat=True, on_text=lambda t: print(t, end=""), stop=["\\n"])  # streamed

Under `torchrun`, every rank builds an `LP` and calls `generate` with the same arguments;
each rank holds a full replica and the ranks split each step's lookahead work. With `tp=T`,
each replica is a tensor-parallel group of T consecutive ranks that each hold 1/T of the
model (lp/mesh.py, lp/engine/tp.py).
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any

import torch

from lp import mesh, models
from lp.collective import Collective
from lp.config import AUTO_KEYS, DecodeConfig, check_settings
from lp.decode.auto import AutoTuner, CostCurve, calibrate_ranks
from lp.decode.batch import PREFILL_CHUNK
from lp.decode.budget import Budget
from lp.decode.hooks import Cancelled
from lp.decode.ladder import LADDER, Shape
from lp.decode.loop import Decoder, Request, StepObserver
from lp.decode.record import Generation
from lp.engine import tp as tensor_parallel
from lp.engine.kernel_choice import requested
from lp.errors import LPError
from lp.frontend.mesh_choice import choose_mesh
from lp.frontend.textstream import TextStream
from lp.lookahead.memory import DRAFT_MEMORY, DraftMemory, check_file, identity
from lp.worker import Worker

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Result(Generation):
    """One prompt's generation, as written to the output JSONL (docs/design.md section 6)."""

    prompt_ids: list[int]
    text: str
    world_size: int
    W: int | None  # None with mode "ar": a plain decode uses no window
    N: int | None
    G: int | None
    mode: str
    temperature: float
    auto: str | None = None  # with W/N/G "auto": what was chosen and why
    # with W/N/G "auto": the S and tokens/s it expected, next to the achieved ones above
    predicted: dict[str, float] | None = None
    tp: int = 1  # ranks per replica (tensor parallelism); world_size / tp replicas
    finish_reason: str = "length"  # "stop": an EOS or a stop string ended it; "length": max_new_tokens
    index: int = 0  # its prompt's place among the prompts of one call (`LP.stream`)

    def to_dict(self) -> dict:
        """The JSONL record: the fields and the figures (new_tokens, S, tokens_per_s)."""
        return {
            **asdict(self),
            "new_tokens": self.new_tokens,
            "S": self.S,
            "tokens_per_s": self.tokens_per_s,
        }


@dataclass(frozen=True)
class Ask:
    """A prompt made ready to decode: its request (lp/decode/sequence.py), the text stream that
    turns its tokens into text (with stop strings or `on_text`), and W=auto's reason."""

    request: Request
    text: TextStream | None
    reason: str | None


def _auto_keys(settings: dict) -> list[str]:
    """W, N, G left to W=auto, as they are where not given (in place: to their defaults, where
    plain decoding is asked for)."""
    settings.update({k: "auto" for k in AUTO_KEYS if k not in settings})
    auto = [k for k in AUTO_KEYS if settings[k] == "auto"]
    if auto and settings.get("mode") == "ar":
        settings.update({k: getattr(DecodeConfig, k) for k in auto})
        return []
    return auto


def _resolve(settings: dict, auto: list[str], shape: Shape) -> None:
    """`shape`'s W, N, G where they are `auto`; with all three, its other keys where not given."""
    chosen = asdict(shape)
    settings.update({k: chosen[k] for k in auto})
    if len(auto) == 3:
        settings.update({k: v for k, v in chosen.items() if k not in auto and settings.get(k) is None})


def _is_ids(prompt: object) -> bool:
    """Whether a prompt is token ids (a non-empty list of ints)."""
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(t, int) for t in prompt)


class LP:
    """A model replica on this rank, its tokenizer, and the decoder around them."""

    def __init__(
        self,
        model: str = "smollm2-135m",
        *,
        dtype: str = "float32",
        device: str = "auto",
        timeout_s: float = 300.0,
        attention: str = "auto",
        graphs: bool | str = "auto",
        compile: bool | str = "auto",
        max_seq_len: int | None = None,
        kv_tokens: int | None = None,
        backend: str = "auto",
        tp: int | str = "auto",
        kernels: str | None = None,
        draft_memory: int = DRAFT_MEMORY,
        draft_memory_file: str | None = None,
    ) -> None:
        """`graphs`: fixed-shape steps, captured as CUDA graphs on a GPU (lp/engine/fixed_steps.py);
        `compile`: torch.compile them; `attention`: auto | sdpa | flex
        (lp/engine/attention.py); `max_seq_len`: the longest sequence, prompt included; `kv_tokens`: the
        KV cache's slots, shared by the sequences decoded together, allocated once (lp/worker.py);
        `backend`: auto | nccl | gloo for the collectives (lp/collective.py); `tp`: ranks per
        replica, which shard the model tensor-parallel (it must divide the world size); "auto"
        chooses it (lp/frontend/mesh_choice.py; 1 on one rank); `kernels`: the matmuls' formulation,
        auto (timed on this machine, the choice printed once) or one named
        (lp/engine/kernel_choice.py; None: `$LP_KERNELS` or auto); `draft_memory`: the tokens of
        earlier decodes' texts kept to draft from (lp/lookahead/memory.py; 0: none);
        `draft_memory_file`: where the memory is loaded from at start (where the file exists) and
        saved to by `close`."""
        if dtype not in DTYPES:
            raise LPError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        mesh.check_tp(tp)
        check_file(draft_memory_file)
        memory = DraftMemory(draft_memory)
        self.memory_file = draft_memory_file
        self.comm = Collective.from_env(device, timeout_s, backend)  # the world: rank 0 reports
        self._tuner: AutoTuner | None = None
        self.mesh: str | None = None  # with tp="auto": the mesh chosen and why
        load = partial(
            self._load,
            model,
            DTYPES[dtype],
            timeout_s,
            max_seq_len=max_seq_len,
            kv_tokens=kv_tokens,
            attention=attention,
            graphs=graphs,
            compile=compile,
            kernels=kernels,
            memory=memory,
        )
        if tp != "auto" or self.comm.world_size == 1:
            load(1 if tp == "auto" else tp)
        else:
            self.mesh, curve = choose_mesh(self, load, model)
            if curve is not None:  # W=auto reuses the calibration of the chosen mesh
                self._tuner = AutoTuner(curve, self.lp.world_size)
            if self.comm.is_main:
                print(f"lp: tp=auto: {self.mesh}", file=sys.stderr, flush=True)
        if draft_memory_file and Path(draft_memory_file).exists():
            self.load_memory(draft_memory_file)
        else:
            self._same_memory(None)

    def _load(self, model: str, dtype: torch.dtype, timeout_s: float, tp: int, memory: DraftMemory, **options) -> None:
        """Split the world into replicas of `tp` ranks, load this rank's model (its shard with
        tp > 1) and build the decoder, which holds the draft `memory`; `options`: the Worker's."""
        self.model = self.decoder = None  # a model loaded before (tp=auto's probe): its memory first
        self.lp, self.tp = mesh.split(self.comm, tp, timeout_s)  # the all-gather's ranks; this replica's
        if tp == 1:
            self.model, self.tokenizer = models.load(model, dtype, self.comm.device)
        else:
            self.model, self.tokenizer = models.load_shard(model, dtype, self.comm.device, self.tp)
            tensor_parallel.report(self.model, self.tp, self.comm.rank)
        worker = Worker(self.model, tp=self.tp, **options)
        if self.comm.is_main and requested(options["kernels"]) == "auto":  # a choice: say what it was
            print(f"lp: kernels: {worker.kernels.describe()}", file=sys.stderr, flush=True)
        self.decoder = Decoder(worker, self.lp, self._eos_ids(), worker.max_seq_len, memory=memory)

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (self.model.generation_config, self.model.config, self.tokenizer):
            eos = getattr(source, "eos_token_id", None)
            ids.update(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        return ids

    def encode(self, prompt: str | list[dict[str, str]], chat: bool = False) -> list[int]:
        """Token ids of a prompt, wrapped in the model's chat template when `chat`; a list of chat
        messages (`{"role": ..., "content": ...}`) goes through the template whatever `chat`."""
        if not prompt:
            raise LPError("empty prompt")
        if chat or not isinstance(prompt, str):
            if self.tokenizer.chat_template is None:
                raise LPError("chat=true but the model's tokenizer has no chat template")
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            enc = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            return list(enc["input_ids"] if hasattr(enc, "keys") else enc)
        return self.tokenizer(prompt)["input_ids"]

    def _auto(self, settings: dict, others: int = 0) -> tuple[str | None, bool]:
        """Resolve W/N/G given as "auto" (in place): the reason for the choice, and whether the
        chosen shape's trees are the step budget's to cut (lp/decode/budget.py).

        Explicit values are always kept. With all three auto the shape is the ladder's likeliest
        to pay beside `others` sequences decoding in the same steps (lp/decode/auto.py), at least
        its smallest, whose drafts the step's budget verifies only where they pay: a step then
        never feeds more than plain decoding would unless its drafts are worth their cost."""
        auto = _auto_keys(settings)
        if not auto:
            return None, False
        shape, reason = self.tuner().choose(allow_plain=len(auto) == 3, others=others)
        if shape is None:
            shape = LADDER[0]
            reason += f"; so {shape.describe()}, whose drafts each step verifies only where they pay"
        _resolve(settings, auto, shape)
        return reason, len(auto) == 3

    def check(self, prompt_ids: list[int], **settings) -> None:
        """Refuse settings and a prompt that could never decode here (an LPError that says why),
        before they reach any rank: W=auto is checked at the ladder's largest shape."""
        check_settings(settings)
        settings = dict(settings)
        _resolve(settings, _auto_keys(settings), LADDER[-1])
        self.decoder.batch().check(Request(list(prompt_ids), DecodeConfig(**settings)))

    def tuner(self) -> AutoTuner:
        """W=auto's chooser, calibrated on this machine at its first use (once per process)."""
        if self._tuner is None:
            self._tuner = AutoTuner(self.calibrate(), self.lp.world_size)
        return self._tuner

    def budget(self) -> Budget:
        """The step's budget, priced with W=auto's step costs and slope (only the trees of shapes
        W=auto chose are cut by it, and choosing one measured the costs: a batch made before any
        request asked for W=auto prices its steps as well as one made after)."""
        return Budget("auto", cost=lambda: self.tuner().cost, slope=lambda: self.tuner().slope(), P=self.lp.world_size)

    def calibrate(self) -> CostCurve:
        """This rank's step costs; under LP the slowest rank's, so all ranks choose alike."""
        return calibrate_ranks(self.decoder.worker, self.comm, self.lp.world_size)

    def ask(
        self,
        prompt: str | list[int] | list[dict[str, str]],
        *,
        chat: bool = False,
        sample_stream: int = 0,
        on_text: Callable[[str], None] | None = None,
        stop: list[str] | None = None,
        cancelled: Cancelled | None = None,
        others: int = 0,
        tag: object = None,
        **settings,
    ) -> Ask:
        """A prompt and its settings made ready to decode (`generate`'s arguments; `others`: the
        sequences expected to decode beside it, which W=auto prices; `tag`: the caller's). Every
        check that needs no decode runs here: an LPError says what is wrong."""
        ids = self.encode(prompt, chat) if not _is_ids(prompt) else list(prompt)
        # every check, before W=auto's first calibration (a request that never runs costs nothing):
        # at the ladder's largest shape, which whatever W=auto chooses cannot exceed
        self.check(ids, **settings)
        settings = dict(settings)
        reason, shared = self._auto(settings, others)
        cfg = DecodeConfig(**settings).validate()
        text = TextStream(self.tokenizer, stop or (), on_text) if on_text or stop else None
        request = Request(
            ids,
            cfg,
            sample_stream,
            on_tokens=text.push if text else None,
            stop=text.stop if stop else None,
            cancelled=cancelled,
            shared=shared,
            tag=tag,
        )
        return Ask(request, text, reason)

    def generate(
        self,
        prompt: str | list[int] | list[str],
        *,
        chat: bool = False,
        sample_stream: int = 0,
        observer: StepObserver | None = None,
        on_text: Callable[[str], None] | None = None,
        stop: list[str] | None = None,
        cancelled: Cancelled | None = None,
        batch: int = 8,
        **settings,
    ) -> Result | list[Result]:
        """Decode one prompt (text, or token ids) with `DecodeConfig` settings (W, N, G,
        max_new_tokens, mode, temperature, top_k, top_p, seed, ...), or a list of prompts, `batch`
        at a time (their results in order; `stream` yields them as they end). W, N and G are
        "auto" unless given, as on the command line: a shape is chosen to maximise tokens/s
        (lp/decode/auto.py; plain decoding where no shape pays), and explicit values override its
        fields. When sampling, `sample_stream` (with `seed`) picks the random stream:
        give each prompt of a run its own (a list's prompts get their places in it). `observer`
        watches each step (lp.bench times forwards with it).

        `on_text` gets the text as the steps commit it (lp/frontend/textstream.py); the decode
        ends at the step where one of the `stop` strings appears, and the text excludes it and
        what follows. `cancelled` is asked on rank 0 before each step: True ends the decode after
        that step on every rank (give it on every rank or none; lp/decode/hooks.py)."""
        if isinstance(prompt, list) and prompt and not _is_ids(prompt):
            if on_text is not None or cancelled is not None or observer is not None:
                raise LPError("on_text, cancelled and observer take one prompt; stream() decodes many")
            done = sorted(self.stream(prompt, chat=chat, stop=stop, batch=batch, **settings), key=lambda r: r.index)
            return done
        ask = self.ask(
            prompt,
            chat=chat,
            sample_stream=sample_stream,
            on_text=on_text,
            stop=stop,
            cancelled=cancelled,
            **settings,
        )
        self._same_in_replica(ask.request.prompt, ask.request.cfg, sample_stream)
        (seq,) = self.decoder.run([ask.request], self.decoder.batch(budget=self.budget(), observer=observer))
        return self.result(ask, seq.result)

    def stream(
        self,
        prompts: Iterable[str | list[int] | Mapping[str, Any]],
        *,
        chat: bool = False,
        stop: list[str] | None = None,
        batch: int = 8,
        prefill_chunk: int = PREFILL_CHUNK,
        **settings,
    ) -> Iterator[Result]:
        """Decode a stream of prompts `batch` at a time, each joining the running steps as soon as
        one ends (continuous batching): each Result as it ends, `index` its place in `prompts`. An
        item may be a mapping with its `prompt` and its own settings over the call's. Prompt i
        samples from random stream i."""

        def requests() -> Iterator[Request]:
            for i, item in enumerate(prompts):
                own = dict(item) if isinstance(item, Mapping) else {"prompt": item}
                text = own.pop("prompt")
                ask = self.ask(
                    text, chat=chat, stop=stop, sample_stream=i, others=batch - 1, tag=i, **{**settings, **own}
                )
                asks[i] = ask
                yield ask.request

        asks: dict[int, Ask] = {}
        runner = self.decoder.batch(max_batch=batch, budget=self.budget(), prefill_chunk=prefill_chunk)
        for seq in self.decoder.run(requests(), runner):
            yield self.result(asks.pop(seq.request.tag), seq.result, index=seq.request.tag)

    def result(self, ask: Ask, g: Generation, index: int = 0) -> Result:
        """The Result of a finished ask."""
        cfg, text = ask.request.cfg, ask.text
        shape = Shape.of(cfg) if cfg.lookahead else None
        predicted = None
        if ask.reason is not None:
            S, tokens_per_s, _ = self._tuner.expect(shape)  # before this sequence teaches the tuner
            predicted = {"S": S, "tokens_per_s": tokens_per_s}
            if shape is not None and g.whole_per_step:  # the S it achieved at its steps' sizes, alike on every rank
                self._tuner.observe(sum(g.whole_per_step) / len(g.whole_per_step), g.S, g.steps)
        return Result(
            **{f.name: getattr(g, f.name) for f in fields(Generation)},
            prompt_ids=ask.request.prompt,
            text=text.finish() if text else self.tokenizer.decode(g.output_ids, skip_special_tokens=True),
            world_size=self.comm.world_size,
            W=cfg.W if shape else None,
            N=cfg.N if shape else None,
            G=cfg.G if shape else None,
            mode=cfg.mode,
            temperature=cfg.temperature,
            auto=ask.reason,
            predicted=predicted,
            tp=self.tp.size,
            finish_reason="stop" if (text and text.end is not None) or self._ends(g.output_ids) else "length",
            index=index,
        )

    def _ends(self, output: list[int]) -> bool:
        """Whether an EOS ended `output`."""
        return bool(output) and output[-1] in self.decoder.eos_ids

    def _same_in_replica(self, ids: list[int], cfg: DecodeConfig, stream: int) -> None:
        """Refuse to decode unless the ranks of each tensor-parallel replica got the same prompt
        and settings (the decoder's handshake compares one rank of each replica): one
        all-gather over all ranks per sequence, so all refuse alike; none without tensor
        parallelism."""
        if self.tp.size == 1:
            return
        mine = zlib.crc32(repr((ids, cfg, stream)).encode()) & 0x7FFFFFFF
        seen = self.comm.all_gather(torch.tensor([mine], device=self.comm.device)).cpu().view(-1)
        if (seen != seen[0]).any():
            raise LPError(
                f"rank mismatch: ranks were given different prompts or settings (fingerprints {seen.tolist()})"
            )

    def _same_memory(self, failed: LPError | None) -> None:
        """Refuse to start unless every rank holds the same draft memory (each loaded its own file;
        `failed`: this rank's error reading it, raised on it, and one line on the others)."""
        if self.comm.world_size > 1:
            mine = torch.tensor([failed is not None, self.memory.fingerprint], device=self.comm.device)
            seen = self.comm.all_gather(mine).cpu().view(-1, 2)
            if failed is None and seen[:, 0].any():
                bad = seen[:, 0].nonzero().view(-1).tolist()
                raise LPError(f"rank(s) {bad} could not load draft_memory_file (each says why)")
            if failed is None and (seen[:, 1] != seen[0, 1]).any():
                raise LPError(
                    "rank mismatch: the ranks hold different draft memories (draft_memory or draft_memory_file "
                    "differs between them, or the file is missing on some: rank 0 writes it)"
                )
        if failed is not None:
            raise failed

    @property
    def memory(self) -> DraftMemory:
        """The draft memory: the texts of finished decodes that later ones draft from (the decoder's)."""
        return self.decoder.memory

    def clear_memory(self) -> None:
        """Forget every text the draft memory holds, between decodes (every rank alike), in place:
        a server's batch and a running stream hold the same memory."""
        self.memory.clear()

    def load_memory(self, path: str | Path) -> None:
        """Replace the draft memory by the one saved at `path`, in its budget (every rank loads its
        own file), between decodes: a batch made before keeps the memory it was given. An LPError
        where the file was learned from another model or tokenizer, or the ranks' memories differ."""
        failed = None  # a rank that cannot read its file says so in the check, so no other rank waits
        try:
            me = identity(self.model, self.tokenizer)
            self.decoder.memory = DraftMemory.load(path, self.memory.budget, me)
        except LPError as e:
            failed = e
        if self.comm.is_main and failed is None:
            print(f"lp: draft memory: {self.memory.tokens} tokens from {path}", file=sys.stderr)
        self._same_memory(failed)

    def save_memory(self, path: str | Path) -> None:
        """Write the draft memory to `path` (rank 0; every rank holds the same), with the model and
        tokenizer it was learned from."""
        if self.comm.is_main:
            self.memory.save(path, identity(self.model, self.tokenizer))

    def close(self) -> None:
        """Save the draft memory to `draft_memory_file` (if given), leave the collectives."""
        try:
            if self.memory_file and self.memory.budget:
                self.save_memory(self.memory_file)
        finally:
            self.comm.close()
