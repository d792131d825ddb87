"""Bad input gives one clear line `lp: error: ...` and a non-zero exit (CLI), or an LPError
(Python API); plus lp.frontend.prompts.read_jsonl.

The CLI runs as real subprocesses for a representative set of errors (before and after the model
is loaded) and one successful run; each costs a few CPU seconds of imports, so the remaining
bad values go through the same hydra entry point in-process (`lp.generate.main` with argv set),
which differs from a subprocess only in who prints the SystemExit message."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import OUTPUT_FIELDS, PYTHON, REPO, TINY_DIR_CONTEXT, reference_greedy, words

import lp.generate
from lp.errors import LPError
from lp.frontend.prompts import Prompt, read_jsonl

SHORT = "w1 w2 w3 w4 w1 w2 w3 w4"
LONG = " ".join(f"w{i % 20}" for i in range(20))  # 20 tokens: 20 + 50 > context 64


# ---------------------------------------------------------------------------------------------
# Real subprocesses, started together and awaited once (the machine has two cores).


@pytest.fixture(scope="module")
def cli_runs(tiny_model_dir, tmp_path_factory, cli_env):
    tmp = tmp_path_factory.mktemp("cli")
    bad = tmp / "bad.jsonl"
    bad.write_text('{"prompt": "w1 w2"}\n{"prompt": "w3", oops}\n', encoding="utf-8")
    model = f"model.name={tiny_model_dir}"
    cases = {
        "W0": [model, f"prompt={SHORT}", "W=0"],
        "too_long": [model, f"prompt={LONG}", "max_new_tokens=50"],
        "unknown_model": ["model.name=no-such-model", f"prompt={SHORT}"],
        "malformed_jsonl": [model, f"prompts={bad}"],
        "ok": [model, f"prompt={SHORT}", "max_new_tokens=6", "W=4", "N=3", "G=4", f"out={tmp / 'out.jsonl'}"],
    }
    procs = {
        name: subprocess.Popen(
            [PYTHON, "-m", "lp.generate", "chat=false", *args],
            cwd=tmp,
            env=cli_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in cases.items()
    }
    results = {}
    for name, p in procs.items():
        try:
            out, err = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        results[name] = (p.returncode, out, err)
    results["out_path"] = tmp / "out.jsonl"
    return results


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("lp: error:")]


def check_cli_error(result, *fragments: str) -> str:
    rc, out, err = result
    assert rc not in (0, None), (rc, out, err)
    assert "Traceback" not in err, err
    lines = error_lines(err)
    assert len(lines) == 1, err
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])
    return lines[0]


def test_cli_W0(cli_runs):
    check_cli_error(cli_runs["W0"], "W must be", "0")


def test_cli_prompt_beyond_context(cli_runs):
    check_cli_error(cli_runs["too_long"], "20 tokens", "50", str(TINY_DIR_CONTEXT))


def test_cli_unknown_model(cli_runs):
    check_cli_error(cli_runs["unknown_model"], "unknown model", "no-such-model")


def test_cli_malformed_jsonl_names_the_line(cli_runs):
    line = check_cli_error(cli_runs["malformed_jsonl"], "bad.jsonl:2")
    assert "malformed" in line


def test_cli_success_writes_the_contract(cli_runs):
    """Control for the error tests: the same command line with good values works, and each
    output line carries the keys of docs/design.md section 6."""
    rc, out, err = cli_runs["ok"]
    assert rc == 0, err
    assert not error_lines(err)
    rows = [json.loads(line) for line in cli_runs["out_path"].read_text().splitlines()]
    assert len(rows) == 1
    row = rows[0]
    for key in OUTPUT_FIELDS:
        assert key in row, key
    assert row["prompt_ids"] == [4, 5, 6, 7, 4, 5, 6, 7]
    assert 1 <= row["new_tokens"] == len(row["output_ids"]) <= 6
    assert (row["W"], row["N"], row["G"], row["mode"], row["world_size"]) == (4, 3, 4, "lookahead", 1)
    assert row["steps"] == len(row["accepted_per_step"]) and sum(row["accepted_per_step"]) == row["new_tokens"]
    assert row["S"] == pytest.approx(row["new_tokens"] / row["steps"])


# ---------------------------------------------------------------------------------------------
# The same entry point in-process.


def run_main(monkeypatch, capsys, *args: str) -> str:
    """Run `python -m lp.generate chat=false ARGS` in-process; return its one error line."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(sys, "argv", ["lp.generate", "chat=false", *args])
    with pytest.raises(SystemExit) as exc:
        lp.generate.main()
    assert exc.value.code == 2, exc.value.code
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("lp: error: "), err
    return err.strip()


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["N=1"], "N must be"),
        (["G=-1"], "G must be"),
        (["max_new_tokens=0"], "max_new_tokens must be"),
        (["mode=beam"], "mode must be"),
        (["W=2.5"], "W must be"),
    ],
)
def test_main_bad_settings(monkeypatch, capsys, tiny_model_dir, args, fragment):
    msg = run_main(monkeypatch, capsys, f"model.name={tiny_model_dir}", f"prompt={SHORT}", *args)
    assert fragment in msg


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["out=/nonexistent/dir/x.jsonl"], "the directory /nonexistent/dir does not exist"),
        (["device=cuda:0"], "sees no CUDA device"),
        (["device=tpu"], "device must be"),
        (["attention=flash"], "attention must be"),
        (["timeout_s=0"], "timeout_s must be"),
        (["Wx=3"], "unknown key 'Wx'"),
        (["W=[1"], "see --help"),
        (["model=no-such-model"], "unknown model 'no-such-model'"),
    ],
)
def test_main_refuses_before_the_model_loads(monkeypatch, capsys, args, fragment):
    """The default model is never needed: its cache points at an empty folder."""
    monkeypatch.setenv("LP_CACHE", "/nonexistent/lp-cache")
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert fragment in run_main(monkeypatch, capsys, f"prompt={SHORT}", *args)


def test_main_empty_prompt(monkeypatch, capsys, tiny_model_dir):
    assert "empty prompt" in run_main(monkeypatch, capsys, f"model.name={tiny_model_dir}", "prompt=")


def test_main_missing_prompts_file(monkeypatch, capsys, tmp_path):
    missing = tmp_path / "nope.jsonl"
    msg = run_main(monkeypatch, capsys, f"prompts={missing}")
    assert "not found" in msg and str(missing) in msg


def test_main_prompt_and_prompts_both_or_neither(monkeypatch, capsys, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "w1"}\n')
    assert "exactly one" in run_main(monkeypatch, capsys, "prompt=w1", f"prompts={f}")
    assert "exactly one" in run_main(monkeypatch, capsys)


def test_main_chat_without_template(monkeypatch, capsys, tiny_model_dir):
    msg = run_main(monkeypatch, capsys, f"model.name={tiny_model_dir}", "chat=true", f"prompt={SHORT}")
    assert "chat template" in msg


# ---------------------------------------------------------------------------------------------
# The Python API.


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    from lp import LP

    return LP(str(tiny_model_dir))


@pytest.mark.parametrize(
    "settings",
    [
        dict(W=0),
        dict(N=1),
        dict(G=-1),
        dict(max_new_tokens=0),
        dict(mode="beam"),
        dict(W="5"),
        dict(max_new_tokens=None),
        dict(bogus=1),
    ],
)
def test_api_bad_settings_raise(lm, settings):
    with pytest.raises(LPError):
        lm.generate(SHORT, **settings)


def test_api_bad_prompts_raise(tiny_model_dir):
    """Refused before W=auto (the API's default) times this machine's steps: a request that can
    never run costs no calibration (minutes of compiling on a fresh GPU machine)."""
    from lp import LP

    lm = LP(str(tiny_model_dir))
    with pytest.raises(LPError, match="empty"):
        lm.generate("")
    with pytest.raises(LPError, match="empty"):
        lm.generate([])
    with pytest.raises(LPError, match="context"):
        lm.generate(LONG, max_new_tokens=TINY_DIR_CONTEXT - 20 + 1)
    with pytest.raises(LPError, match="chat template"):
        lm.generate(SHORT, chat=True)
    assert lm._tuner is None


def test_api_bad_model_and_dtype():
    from lp import LP

    with pytest.raises(LPError, match="unknown model"):
        LP("no-such-model")
    with pytest.raises(LPError, match="dtype"):
        LP("no-such-model", dtype="float64")


def test_api_generate_is_exact_at_the_context_edge(lm):
    """prompt + max_new_tokens == context is allowed, and lookahead equals plain greedy."""
    ids = lm.encode(LONG)
    n = TINY_DIR_CONTEXT - len(ids)
    r = lm.generate(ids, W=7, N=5, G=7, max_new_tokens=n)
    ar = lm.generate(ids, mode="ar", max_new_tokens=n)
    assert r.output_ids == ar.output_ids
    eos = sorted(lm.decoder.eos_ids)
    ref = reference_greedy(lm.model, ids, n, eos=eos or None)
    if eos and ref[-1] in eos:
        ref = ref[: ref.index(ref[-1]) + 1]
    assert r.output_ids == ref
    assert r.prompt_ids == ids and r.text == words(r.output_ids)


# ---------------------------------------------------------------------------------------------
# lp.frontend.prompts.read_jsonl


def write(tmp_path: Path, *lines: str) -> Path:
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return p


def test_read_prompt_and_turns(tmp_path):
    p = write(
        tmp_path,
        json.dumps({"id": "a", "prompt": "first", "category": "x"}),
        "",
        json.dumps({"question_id": 81, "turns": ["turn one", "turn two"], "category": "writing"}),
        json.dumps({"prompt": "third"}),
    )
    got = read_jsonl(p)
    assert got == [Prompt("a", "first", "x"), Prompt(81, "turn one", "writing"), Prompt(2, "third", None)]


def test_prompt_wins_over_turns(tmp_path):
    p = write(tmp_path, json.dumps({"prompt": "p", "turns": ["t"]}))
    assert read_jsonl(p)[0].text == "p"


def test_limit(tmp_path):
    p = write(tmp_path, *(json.dumps({"prompt": f"q{i}"}) for i in range(5)))
    assert [x.text for x in read_jsonl(p, limit=2)] == ["q0", "q1"]
    assert len(read_jsonl(p, limit=10)) == 5
    assert len(read_jsonl(p)) == 5


def test_limit_stops_before_a_later_bad_line(tmp_path):
    p = write(tmp_path, json.dumps({"prompt": "q0"}), "not json")
    assert [x.text for x in read_jsonl(p, limit=1)] == ["q0"]


def test_limit_zero_reads_nothing(tmp_path):
    """`limit` is "read at most this many prompts": 0 must not return a prompt (an empty list
    or a clear error are both acceptable)."""
    p = write(tmp_path, json.dumps({"prompt": "q0"}), json.dumps({"prompt": "q1"}))
    try:
        got = read_jsonl(p, limit=0)
    except LPError:
        return
    assert got == []


@pytest.mark.parametrize(
    "bad_line,fragment",
    [
        ('{"prompt": "x", oops}', "malformed JSON at column 17: Expecting property name"),
        ('{"prompt": "a\tb"}', "malformed JSON at column 14: Invalid control character"),
        ('{"text": "no prompt key"}', "'prompt' or 'turns'"),
        ('{"turns": []}', "'prompt' or 'turns'"),
        ('{"prompt": ""}', "'prompt' or 'turns'"),
        ('{"prompt": 5}', "'prompt' or 'turns'"),
        ('["a", "list"]', "'prompt' or 'turns'"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path, bad_line, fragment):
    p = write(tmp_path, json.dumps({"prompt": "ok"}), "", bad_line)
    with pytest.raises(LPError) as exc:
        read_jsonl(p)
    msg = str(exc.value)
    assert f"{p}:3" in msg and fragment in msg and "\n" not in msg


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(LPError, match="not found"):
        read_jsonl(tmp_path / "missing.jsonl")
    with pytest.raises(LPError, match="not found"):
        read_jsonl(tmp_path)  # a directory is not a prompts file
    with pytest.raises(LPError, match="no prompts"):
        read_jsonl(write(tmp_path, "", "  "))


def test_unicode(tmp_path):
    p = write(tmp_path, json.dumps({"prompt": "héllo → 世界"}, ensure_ascii=False))
    assert read_jsonl(p)[0].text == "héllo → 世界"


def test_repo_root_is_where_configs_live():
    assert (REPO / "configs" / "generate.yaml").is_file()
