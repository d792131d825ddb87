"""Start P ranks by fork from one process that has already imported torch, transformers and lp.

    python _zygote.py OUT_DIR NPROC python-args...    (MASTER_ADDR / MASTER_PORT in the env)
    python _zygote.py OUT_DIR NPROC --batch CASES.json


Importing torch + transformers costs each fresh process seconds of CPU, which on a shared
2-core machine dominates the suite; forked ranks share those imports (as with
torch.multiprocessing's "fork" start method). Each rank gets RANK / WORLD_SIZE / LOCAL_RANK,
writes its stdout and stderr to OUT_DIR/{rank}.out|.err, and runs `python-args` as the
interpreter would (`SCRIPT ARGS...` or `-m MODULE ARGS...`). The zygote reaps the ranks as they
exit and records each one's exit code and exit time in OUT_DIR/exits.json.

`--batch`: CASES.json maps case names to {"argv": python-args, "port": MASTER_PORT}; every
case's NPROC ranks are forked at once, with OUT_DIR/CASE/ as that case's OUT_DIR.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _worker  # noqa: E402  (wraps the torch.distributed entry points before lp is imported)

_worker.install_counters()

# Everything a rank would import lazily anyway (no computation: no thread pools before fork).
import hydra  # noqa: E402,F401
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402,F401
from transformers.models.llama import modeling_llama  # noqa: E402,F401
from transformers.models.mistral import modeling_mistral  # noqa: E402,F401
from transformers.models.qwen2 import modeling_qwen2  # noqa: E402,F401

import lp  # noqa: E402,F401
import lp.generate  # noqa: E402,F401

for _name in ("PreTrainedTokenizerFast", "TokenizersBackend"):
    getattr(transformers, _name, None)


def _run_rank(rank: int, nproc: int, out_dir: Path, argv: list[str]) -> int:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc))
    for fd, name in ((1, f"{rank}.out"), (2, f"{rank}.err")):
        f = os.open(out_dir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    try:
        if Path(argv[0]).resolve() == Path(_worker.__file__).resolve():
            return _worker.main(argv[1:]) or 0  # same module object as the counters above
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
        return 0
    except SystemExit as e:  # as the interpreter does: None -> 0, int -> itself, else print -> 1
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1


def main() -> None:
    out_dir, nproc, argv = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    if argv[0] == "--batch":
        cases = {Path(out_dir, name): case for name, case in json.loads(Path(argv[1]).read_text()).items()}
    else:
        cases = {out_dir: {"argv": argv}}
    sys.stdout.flush()
    sys.stderr.flush()
    pids = {}
    for case_dir, case in cases.items():
        case_dir.mkdir(exist_ok=True)
        if "port" in case:
            os.environ["MASTER_PORT"] = str(case["port"])
        for rank in range(nproc):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = _run_rank(rank, nproc, case_dir, case["argv"])
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            pids[pid] = (case_dir, rank)
    exits: dict[Path, dict[int, list]] = {case_dir: {} for case_dir in cases}
    while pids:
        pid, status = os.waitpid(-1, 0)
        if pid in pids:
            case_dir, rank = pids.pop(pid)
            exits[case_dir][rank] = [os.waitstatus_to_exitcode(status), time.time()]
            tmp = case_dir / "exits.json.tmp"
            tmp.write_text(json.dumps(exits[case_dir]))
            tmp.replace(case_dir / "exits.json")


if __name__ == "__main__":
    main()
