"""One model replica and its KV cache: runs its rank's share of a step, one masked forward with
no communication, and returns logits for the rows the step uses.

The cache is allocated once, when the worker is built: `max_seq_len` committed tokens plus
room for one step's speculative tokens after them. Steps run
eagerly at their exact size (the CPU default: a few-token forward costs in proportion to its tokens
there) or at fixed shapes, compiled and captured as CUDA graphs (the CUDA default;
lp/engine/fixed_steps.py).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

from lp.engine import attention, kernel_choice, llama
from lp.engine.attention import FLEX_BLOCK
from lp.engine.fixed_steps import FixedSteps, PlainGreedy
from lp.engine.forward import Forward, StepInputs, TransformersForward, kv_shape
from lp.engine.kernels import Kernels
from lp.engine.kv import KVCache
from lp.engine.step_tensors import StepTensors, bucket, step_tensors
from lp.engine.tp import ALONE, TensorGroup
from lp.errors import LPError
from lp.lookahead.mask import StepLayout, step_layout

DEFAULT_MAX_SEQ_LEN = 8192  # committed tokens when neither the user nor a shorter context says less
LAYOUTS_KEPT = 256  # step layouts kept on the device
PLAIN = step_layout(1, 0, 2, range(0), 0)  # a plain step: x0 alone, its logits
STEP_ROOM = 512  # cache slots past max_seq_len for one step's speculative tokens (W=60 N=5 G=60 fits)


def context_length(model: torch.nn.Module) -> int:
    """The longest sequence the model attends over exactly (Mistral: its sliding window)."""
    cfg = model.config.get_text_config()
    window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
    return min(cfg.max_position_embeddings, window or cfg.max_position_embeddings)


def check_options(
    attention_choice: str, graphs: bool | str, compile: bool | str, max_seq_len: int | None, kernels: str | None = None
) -> None:
    """Refuse engine settings that no model could take (checked before any model loads)."""
    kernel_choice.check_choice(kernel_choice.requested(kernels))
    if attention_choice not in attention.BACKENDS:
        raise LPError(f"attention must be one of {', '.join(attention.BACKENDS)}, got {attention_choice!r}")
    for key, flag in (("graphs", graphs), ("compile", compile)):
        if flag != "auto" and not isinstance(flag, bool):
            raise LPError(f"{key} must be true, false or auto, got {flag!r}")
    if max_seq_len is not None and (
        not isinstance(max_seq_len, int) or isinstance(max_seq_len, bool) or max_seq_len < 2
    ):
        raise LPError(f"max_seq_len must be an integer >= 2, got {max_seq_len!r}")


def _backend(choice: str, device: torch.device, lean: bool, fixed: bool, compiled: bool) -> str:
    """The attention backend for `choice` (lp/engine/attention.py); an LPError says why one cannot run."""
    if choice == "auto":
        if lean and device.type == "cuda":
            # flex only compiled: uncompiled, it materialises scores over the whole cache
            return "flex" if fixed and compiled else "split" if not fixed and attention.flash_available() else "sdpa"
        return "sdpa"
    if choice != "sdpa" and not lean:
        raise LPError(f"attention={choice} needs a Llama-family model ({', '.join(llama.FAMILY)})")
    if choice == "flex" and not fixed:
        raise LPError("attention=flex needs fixed-shape steps (graphs=true)")
    if choice == "split" and fixed:
        raise LPError("attention=split needs graphs=false (it reads the committed length on the host)")
    return choice


class Worker:
    """Runs forwards of a transformers causal LM over lp's step layouts.

    `graphs`: fixed-shape steps, captured as CUDA graphs on a GPU (`auto`: on CUDA).
    `compile`: torch.compile the fixed-shape forward (`auto`: with graphs on CUDA).
    `attention`: `auto`, `sdpa`, `flex` or `split` (lp/engine/attention.py).
    `max_seq_len`: the longest sequence, prompt included (default: the model's context, at
    most 8192); the cache holds that many tokens plus `STEP_ROOM` slots for a step.
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
        attention: str = "auto",
        graphs: bool | str = "auto",
        compile: bool | str = "auto",
        tp: TensorGroup = ALONE,
        kernels: str | None = None,
        kernel_timer: kernel_choice.Timer = kernel_choice.wall_clock,
    ) -> None:
        check_options(attention, graphs, compile, max_seq_len, kernels)
        param = next(model.parameters())
        self.model, self.device, self.tp = model, param.device, tp
        self.max_seq_len = min(context_length(model), max_seq_len or DEFAULT_MAX_SEQ_LEN)
        # whole FlexAttention blocks: no partial block at the cache's end
        capacity = -(-(self.max_seq_len + STEP_ROOM) // FLEX_BLOCK) * FLEX_BLOCK
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
        self.attention = _backend(attention, self.device, lean, fixed, compiled=compiled)
        layers, kv_heads, head_dim = kv_shape(model)
        self.kv = KVCache(layers, kv_heads // tp.size, head_dim, capacity, param.dtype, self.device)
        if lean:
            self.forward: Forward = llama.LlamaForward(model, self.kv, self.attention, tp)
            self.kernels = kernel_choice.choose(
                self.forward.matrices(),
                self.device,
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
            FixedSteps(self.forward, self.kv, self.device, self.attention == "flex", compile=compiled)
            if fixed
            else None
        )
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        # Step ids go to the device from pinned memory without blocking the host (CUDA only).
        self._staging = torch.empty(capacity, dtype=torch.long, pin_memory=True) if cuda else None
        self._staged = torch.cuda.Event() if cuda else None  # marks the last copy out of the staging buffer
        self._layouts: OrderedDict[tuple, StepTensors] = OrderedDict()  # by `StepLayout.key`, most recent last
        self._plain = PlainGreedy(self.device)
        self._plain_position = 0  # the next plain step's x0 position (eager steps)

    @property
    def capacity(self) -> int:
        return self.kv.capacity

    def step_slots(self, tokens: int) -> int:
        """Cache slots a step of `tokens` tokens writes (its padded size at fixed shapes)."""
        return bucket(tokens) if self.fixed is not None else tokens

    def reset(self, tokens: int, step_tokens: int, fewest_step_tokens: int | None = None, kept: int = 0) -> None:
        """Start a new sequence that commits at most `tokens` and runs steps of
        `fewest_step_tokens` (default: `step_tokens`) to `step_tokens` tokens, keeping the KV of
        up to `kept` drafts a step (`keep`); refuse it if the cache cannot hold that. At fixed
        shapes, every bucket of those sizes (and the keep) is compiled and captured here, before
        the sequence's clock starts (once per process)."""
        if tokens > self.max_seq_len:
            raise LPError(
                f"the sequence needs {tokens} tokens (prompt + max_new_tokens), "
                f"more than max_seq_len={self.max_seq_len}"
            )
        if tokens + self.step_slots(step_tokens) > self.capacity:
            raise LPError(
                f"a step of {step_tokens} tokens does not fit in the KV cache after {tokens} tokens: "
                f"lower W or G (at most {STEP_ROOM} step tokens past max_seq_len)"
            )
        self.kv.reset()
        if self.fixed is not None:
            self.fixed.prepare(fewest_step_tokens or step_tokens, step_tokens, kept)

    def commit(self, n: int, on_device: bool = True) -> None:
        """`KVCache.commit`."""
        self.kv.commit(n, on_device)

    def upload(self, ids: np.ndarray) -> torch.Tensor:
        """A step's token ids on the device."""
        host = torch.from_numpy(ids)
        if self.device.type == "cpu":  # used where it lies (a step's ids are its own array)
            return host
        if self._staging is None:
            return host.to(self.device)
        self._staged.synchronize()  # done long ago in practice: the last step was read since
        staged = self._staging[: len(ids)]
        staged.copy_(host)
        out = staged.to(self.device, non_blocking=True)
        self._staged.record()
        return out

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor) -> None:
        """Commit the KV of a prompt prefix (causal), without computing any logits."""
        n, c = ids.shape[0], self.kv.length
        if n == 0:
            return
        block = torch.ones((n, n), dtype=torch.bool, device=self.device).tril_()
        positions = torch.arange(c, c + n, device=self.device)
        rows = torch.zeros(0, dtype=torch.long, device=self.device)
        self.forward(StepInputs(ids, positions, block, rows, extent=c + n, committed=c, causal=c == 0))
        self.kv.commit(n)

    def on_device(self, layout: StepLayout) -> StepTensors:
        """`layout` on the device, uploaded once per shape and kept while it is among the recent
        ones (`evict`)."""
        key = layout.key
        dev = self._layouts.get(key)
        if dev is None:
            dev = self._layouts[key] = step_tensors(layout, self.device, self.fixed is not None)
        else:
            self._layouts.move_to_end(key)
        return dev

    def evict(self) -> None:
        """Drop the device layouts beyond the `LAYOUTS_KEPT` most recent: draft trees make many
        shapes, and a rank's share of a split step often repeats one. `step` calls it once its
        forward is queued, where freeing a layout's tensors delays no forward."""
        while len(self._layouts) > LAYOUTS_KEPT:
            self._layouts.popitem(last=False)

    @torch.inference_mode()
    def step(self, ids: torch.Tensor, layout: StepLayout, x0_position: int) -> torch.Tensor:
        """One step's forward: logits `[R, vocab]` for `layout.logit_rows`. The KV of all n
        tokens is written but not committed; call `commit(layout.m)` to keep the pending ones."""
        dev = self.on_device(layout)
        if self.fixed is not None:
            logits = self.fixed.step(ids, dev, x0_position)
        else:
            c = self.kv.length
            logits = self.forward(
                StepInputs(ids, dev.depth + x0_position, dev.block, dev.rows, extent=c + layout.size, committed=c)
            )
        self.evict()
        return logits

    def keep(self, path: torch.Tensor, layout: StepLayout, accepted: torch.Tensor) -> None:
        """Keep the KV of the last step's `accepted` draft tokens, its tree nodes `path` (local
        indices by depth, -1 padded: `Acceptance.path`), after its pending ones (`commit` first):
        the next step feeds only its x0. Queued on the device with no host value; the host's
        length follows with `commit(n, on_device=False)` once the step's outcome is read."""
        offset = layout.size - len(layout.parents) - layout.m  # the first node's slot past the pending
        if self.fixed is not None and self.fixed.capture:
            self.fixed.keep(path, offset, accepted)
        else:
            self.kv.keep(path, offset, accepted)

    def greedy_start(self, token: torch.Tensor, x0_position: int, length: int, checksum: int) -> None:
        """Begin plain greedy steps (`greedy_step`): the first one's input `token` (`[1]`, on the
        device) at `x0_position`; `length` and `checksum`: the output's so far (lp/message.py)."""
        self._plain.start(token, x0_position, length, checksum)
        self._plain_position = x0_position

    @torch.inference_mode()
    def greedy_step(self) -> torch.Tensor:
        """One plain greedy step (`mode=ar`): forward, argmax, the step's message
        (lp/fixed_steps.py's `PlainGreedy`), its token committed and kept on the device as the
        next step's input. At fixed shapes on a GPU the whole step is one CUDA graph replay."""
        if self.fixed is not None:
            message = self.fixed.greedy(self._plain)
            self.kv.commit(1, on_device=False)  # the step advanced the device's length
            return message
        message = self._plain.message(self.step(self._plain.token, PLAIN, self._plain_position))
        self.commit(1)
        self._plain_position += 1
        return message
