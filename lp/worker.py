"""One model replica and its KV cache: runs this rank's packed steps (one forward over the tokens
of every sequence a step feeds, with no communication) and returns logits for the rows the step
uses.

The cache is allocated once, when the worker is built, as pages shared by the sequences
(lp/engine/pages.py): `kv_tokens` slots in all, each sequence holding the pages its tokens reach.
Steps run eagerly at their exact size (the CPU default: a few-token forward costs in proportion to
its tokens there) or at fixed shapes, compiled and captured as CUDA graphs (the CUDA default;
lp/engine/fixed_steps.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch

from lp.engine import attention, kernel_choice, llama
from lp.engine.attention import FLEX_BLOCK, Dense
from lp.engine.fixed_steps import FixedSteps
from lp.engine.forward import Forward, StepInputs, TransformersForward, kv_shape
from lp.engine.kernels import Kernels
from lp.engine.kv import KVCache
from lp.engine.packed import GROUP_CALL_PAGES, PackedStep, PackedTensors, bucket, exact, prompt_chunk, step_segment
from lp.engine.pages import PAGE, SequenceKV, pages_for
from lp.engine.tp import ALONE, TensorGroup
from lp.errors import LPError
from lp.lookahead.mask import StepLayout

DEFAULT_MAX_SEQ_LEN = 8192  # committed tokens when neither the user nor a shorter context says less
STEP_ROOM = 512  # positions past max_seq_len for one step's speculative tokens (W=60 N=5 G=60 fits)
MAX_STEP = 1024  # tokens one sequence's step may feed a rank: the largest of W=auto's shapes
TIMED_CONTEXT = 256  # committed tokens before a timed forward (the kernel choice's, W=auto's calibration's)


def context_length(model: torch.nn.Module) -> int:
    """The longest sequence the model attends over exactly (Mistral: its sliding window)."""
    cfg = model.config.get_text_config()
    window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
    return min(cfg.max_position_embeddings, window or cfg.max_position_embeddings)


def check_options(
    attention_choice: str,
    graphs: bool | str,
    compile: bool | str,
    max_seq_len: int | None,
    kernels: str | None = None,
    kv_tokens: int | None = None,
) -> None:
    """Refuse engine settings that no model could take (checked before any model loads)."""
    kernel_choice.check_choice(kernel_choice.requested(kernels))
    if attention_choice not in attention.BACKENDS:
        raise LPError(f"attention must be one of {', '.join(attention.BACKENDS)}, got {attention_choice!r}")
    for key, flag in (("graphs", graphs), ("compile", compile)):
        if flag != "auto" and not isinstance(flag, bool):
            raise LPError(f"{key} must be true, false or auto, got {flag!r}")
    for key, value, low in (("max_seq_len", max_seq_len, 2), ("kv_tokens", kv_tokens, FLEX_BLOCK)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
            raise LPError(f"{key} must be an integer >= {low}, got {value!r}")


def _backend(choice: str, lean: bool, fixed: bool) -> str:
    """The attention backend for `choice` (lp/engine/attention.py); an LPError says why one cannot run."""
    if choice == "auto":
        # sdpa on every device: FlexAttention's multi-token steps, faster on GPUs, failed CUDA
        # tests that sdpa's passed on an H200 (results/gpu/h200-2026-11-28), so they stay opt-in
        # until a GPU shows them equal to the eager step
        return "sdpa"
    if choice == "flex" and not lean:
        raise LPError(f"attention=flex needs a Llama-family model ({', '.join(llama.FAMILY)})")
    if choice == "flex" and not fixed:
        raise LPError("attention=flex needs fixed-shape steps (graphs=true)")
    return choice


class _Probe:
    """Whole forwards for the kernel choice to time (lp/engine/kernel_choice.py `Forwards`): M
    random tokens after a prefilled context, logits of every row, every matmul by the formulation
    named. `sizes`: the kernel choice's that the cache holds beside the context; `context`:
    `TIMED_CONTEXT`, or what the model and the cache allow. Its pages are taken at the first
    forward asked for (none where the choice was cached) and given back on leaving, each size's
    inputs made once; the weight copies a formulation reads are made once, and those the choice
    does not read dropped after."""

    def __init__(self, worker: Worker) -> None:
        self.worker, self.kv, self.inputs = worker, None, {}
        self.gen = torch.Generator().manual_seed(0)
        self.sizes = tuple(M for M in kernel_choice.SIZES if M < worker.kv_tokens)
        self.context = worker.timed_context(TIMED_CONTEXT, self.sizes[-1])

    def __enter__(self) -> _Probe:
        return self

    def __exit__(self, *_: object) -> None:
        if self.kv is not None:
            self.kv.release()

    def __call__(self, name: str, M: int) -> Callable[[], torch.Tensor]:
        w = self.worker
        if self.kv is None:
            self.kv = w.random_sequence(self.context, self.sizes[-1], self.gen)
        w.forward.use(Kernels.only(name), keep=True)
        if M not in self.inputs:  # made once: the timed run is the forward alone
            on = exact(w.random_step([self.kv], [M], self.gen), w.kv.pool.owner, w.kv.pool.index, w.query_groups)
            self.inputs[M] = StepInputs(on.ids, on.positions, on.slots, on.rows, on.attend)
        inputs = self.inputs[M]
        return lambda: w.forward(inputs)


class Worker:
    """Runs forwards of a transformers causal LM over lp's packed steps.

    `graphs`: fixed-shape steps, captured as CUDA graphs on a GPU (`auto`: on CUDA).
    `compile`: torch.compile the fixed-shape forward (`auto`: with graphs on CUDA).
    `attention`: `auto`, `sdpa` or `flex` (lp/engine/attention.py).
    `max_seq_len`: the longest sequence, prompt included (default: the model's context, at most
    8192). `kv_tokens`: the cache's slots, shared by all sequences (default: one sequence of
    `max_seq_len` and a step's tokens, or 32,768, whichever is more).
    `tp`: the tensor-parallel group whose shard of the model `model` holds (lp/engine/tp.py); the
    cache then holds this rank's KV heads only.
    `kernels`: the formulation of the lean forward's matmuls (lp/engine/kernels.py): `auto`
    (timed here once per machine and model shape, lp/engine/kernel_choice.py), or one named
    for every matmul; None: `$LP_KERNELS`, else `auto`. `kernel_timer`: the clock of that
    timing (tests pass a fake one)."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        max_seq_len: int | None = None,
        kv_tokens: int | None = None,
        attention: str = "auto",
        graphs: bool | str = "auto",
        compile: bool | str = "auto",
        tp: TensorGroup = ALONE,
        kernels: str | None = None,
        kernel_timer: kernel_choice.Timer = kernel_choice.wall_clock,
    ) -> None:
        check_options(attention, graphs, compile, max_seq_len, kernels, kv_tokens)
        param = next(model.parameters())
        self.model, self.device, self.tp = model, param.device, tp
        self.max_seq_len = min(context_length(model), max_seq_len or DEFAULT_MAX_SEQ_LEN)
        cuda = self.device.type == "cuda"
        # a CUDA graph cannot hold a collective over gloo (ranks sharing a GPU)
        capturable = tp.size == 1 or tp.capturable
        if graphs is True and cuda and not capturable:
            raise LPError("graphs=true with tp needs NCCL (one GPU per rank); use graphs=false")
        fixed = cuda and capturable if graphs == "auto" else graphs
        compiled = cuda and fixed if compile == "auto" else compile
        if compiled and not fixed:  # eager steps run at their exact sizes: one compile per size
            raise LPError("compile=true needs fixed-shape steps: set graphs=true (or leave compile=auto)")
        lean = llama.supports(model)
        if tp.size > 1 and not lean:
            raise LPError(f"tp={tp.size} needs a Llama-family model ({', '.join(llama.FAMILY)})")
        self.attention = _backend(attention, lean, fixed)
        layers, kv_heads, head_dim = kv_shape(model)
        tokens = kv_tokens or max(self.max_seq_len + STEP_ROOM, 32768)
        per = FLEX_BLOCK // PAGE  # whole FlexAttention key blocks: no partial block at the cache's end
        pages = -(-(1 + pages_for(tokens)) // per) * per
        self.kv = KVCache(layers, kv_heads // tp.size, head_dim, pages, param.dtype, self.device)
        self.lean = lean
        self.query_groups = model.config.get_text_config().num_attention_heads // kv_heads
        # the pages an eager step's attention group is priced as (lp/engine/packed.py `by_length`):
        # the groupings' timing (tools.attention_groups) sets others
        self.call_pages = GROUP_CALL_PAGES
        self._owners = 0  # the last sequence id handed out (ids are never reused)
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        positions = self.max_seq_len + STEP_ROOM
        self.fixed: FixedSteps | None = None  # steps run eagerly (the kernel choice's) until the fixed shapes are made
        if lean:
            self.forward: Forward = llama.LlamaForward(model, self.kv, positions, tp)
            with _Probe(self) as probe:
                self.kernels = kernel_choice.choose(
                    self.forward.matrices(),
                    self.device,
                    forward=probe,
                    sizes=probe.sizes,
                    context=probe.context,
                    choice=kernel_choice.requested(kernels),
                    compiled=compiled,
                    timer=kernel_timer,
                    agree=tp.all_reduce if tp.size > 1 else None,
                )
            self.forward.use(self.kernels)
        else:
            self.forward = TransformersForward(model, self.kv)
            self.kernels = Kernels.only("linear", "the model's own modules")
        self.fixed = (
            FixedSteps(
                self.forward,
                self.kv,
                self.device,
                self.attention == "flex",
                compile=compiled,
                groups=self.query_groups if cuda else 1,
            )
            if fixed
            else None
        )

    @property
    def kv_tokens(self) -> int:
        """The cache's slots that sequences may hold (all but the pad page's)."""
        return (self.kv.pool.pages - 1) * PAGE

    def step_slots(self, tokens: int) -> int:
        """Rows a step of `tokens` tokens runs (its padded size at fixed shapes)."""
        return bucket(tokens) if self.fixed is not None else tokens

    def sequence(self, tokens: int, step_tokens: int) -> SequenceKV:
        """A new sequence's KV: it commits at most `tokens` and its steps feed at most `step_tokens`;
        an LPError where it could not fit the model or the cache."""
        if tokens > self.max_seq_len:
            raise LPError(
                f"the sequence needs {tokens} tokens (prompt + max_new_tokens), "
                f"more than max_seq_len={self.max_seq_len}"
            )
        self._owners += 1
        return SequenceKV(self.kv.pool, self._owners, tokens + step_tokens)

    @torch.inference_mode()
    def run(self, step: PackedStep) -> tuple[torch.Tensor, PackedTensors]:
        """One step's forward: logits `[R, vocab]` for `step.rows`, and the step on the device.
        Every token's KV is written; the sequences' lengths (their hosts') say what is kept."""
        if self.fixed is not None:
            return self.fixed.step(step)
        # a model of its own modules attends by one dense mask: no groups built for it
        groups = self.query_groups if self.lean else 0
        on = exact(step, self.kv.pool.owner, self.kv.pool.index, groups, self.call_pages)
        if not self.lean:
            on.attend = Dense(on.visible, self.kv.slots).refresh()
        return self.forward(StepInputs(on.ids, on.positions, on.slots, on.rows, on.attend)), on

    def timed_context(self, context: int, step_tokens: int) -> int:
        """The committed tokens a timed step of `step_tokens` runs after: `context`, fewer where the
        model's positions or the cache hold fewer (at least 1)."""
        room = min(self.max_seq_len + STEP_ROOM, self.kv_tokens) - step_tokens
        return max(1, min(context, self.max_seq_len - 1, room))

    def random_sequence(self, context: int, step_tokens: int, gen: torch.Generator) -> SequenceKV:
        """A sequence holding `context` random tokens' KV (drawn from `gen`), its room for a step of
        `step_tokens` after them reserved: what timed steps run after (the kernel choice, W=auto's
        calibration). The caller releases it."""
        kv = self.sequence(context, step_tokens)
        try:
            self.prefill(kv, torch.randint(0, self.vocab_size, (context,), generator=gen).numpy())
            kv.reserve(context + step_tokens)
        except BaseException:
            kv.release()
            raise
        return kv

    @contextmanager
    def random_sequences(
        self, contexts: list[int], step_tokens: int, gen: torch.Generator
    ) -> Iterator[list[SequenceKV]]:
        """`random_sequence` of each of `contexts`, all released when the block ends (or one fails)."""
        kvs: list[SequenceKV] = []
        try:
            for context in contexts:
                kvs.append(self.random_sequence(context, step_tokens, gen))
            yield kvs
        finally:
            for kv in kvs:
                kv.release()

    def random_step(self, kvs: list[SequenceKV], sizes: list[int], gen: torch.Generator) -> PackedStep:
        """A step of `sizes[i]` random tokens (drawn from `gen`) after each of `kvs`' committed
        tokens, causal, a logits row each (as a tree's nodes have): what timed steps run."""
        chunks = []
        for kv, n in zip(kvs, sizes):
            ids = torch.randint(0, self.vocab_size, (n,), generator=gen).numpy()
            chunks.append(prompt_chunk(kv.owner, ids, kv.length, kv.table, logits=True))
        return PackedStep(chunks)

    @torch.inference_mode()
    def prefill(self, kv: SequenceKV, ids: list[int] | np.ndarray) -> None:
        """Commit the KV of `ids` after `kv`'s committed tokens, one causal step (tools, tests)."""
        ids = np.asarray(ids, dtype=np.int64)
        if not len(ids):
            return
        kv.reserve(kv.length + len(ids))
        self.run(PackedStep([prompt_chunk(kv.owner, ids, kv.length, kv.table)]))
        kv.length += len(ids)

    @torch.inference_mode()
    def step(
        self, kv: SequenceKV, layout: StepLayout, ids: np.ndarray | list[int], x0: int | None = None
    ) -> torch.Tensor:
        """One sequence's step of `layout` after its committed tokens, nothing committed (tools,
        tests): logits `[R, vocab]` of `layout.logit_rows`. `x0`: x0's position (default: the
        last pending token's, right after the committed ones)."""
        ids = np.asarray(ids, dtype=np.int64)
        kv.reserve(kv.length + layout.size)
        x0 = kv.length + layout.m - 1 if x0 is None else x0
        return self.run(PackedStep([step_segment(kv.owner, layout, ids, x0, kv.length, kv.table)]))[0]

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy the KV at slots `src` onto slots `dst` (the kept drafts': lp/engine/kv.py `move`)."""
        if self.fixed is not None:
            self.fixed.move(src, dst)
        else:
            self.kv.move(src, dst)

    def prepare(self, most: int, fewest: int = 1, moves: int = 0) -> None:
        """At fixed shapes, compile and capture every bucket of steps of `fewest` to `most` tokens
        now, and the kept drafts' moves of up to `moves` slots."""
        if self.fixed is not None:
            self.fixed.prepare(fewest, most)
            self.fixed.prepare_moves(moves)
