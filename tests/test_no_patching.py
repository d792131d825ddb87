"""Nothing in `lp/` replaces another object's methods (monkey-patching): code that watches or
changes a decode goes through an interface (lp.decode.loop.StepObserver, torch's module hooks).

The check reads the source (ast): it flags `setattr` / `delattr` on anything but `self` /
`cls`, writes into another object's `__dict__`, assignments to another object's `forward` or
`__call__`, and assignments to another object's attribute of a function made for the purpose
(a lambda, a nested `def`, `functools.partial`, `types.MethodType`, `f.__get__(obj)`) or of a
method saved earlier from an attribute of the same name (`step = worker.step` ... `worker.step
= step`). Plain attribute assignment (`self.x = ...`, `row.name = "..."`) is not flagged."""

from __future__ import annotations

import ast
import textwrap

from helpers import REPO

OWN = {"self", "cls"}
METHOD_SLOTS = {"forward", "__call__"}
WRAPPERS = {"partial", "MethodType"}


def _is_own(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in OWN


def _pairs(node: ast.stmt) -> list[tuple[ast.expr, ast.expr | None]]:
    """(target, value) of an assignment, tuples unpacked element by element."""
    if isinstance(node, ast.Assign):
        out = []
        for t in node.targets:
            if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple) and len(t.elts) == len(node.value.elts):
                out += list(zip(t.elts, node.value.elts))
            else:
                out.append((t, node.value))
        return out
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return [(node.target, node.value)]
    return []


def _made_callable(value: ast.expr | None, local_defs: set[str]) -> bool:
    """A function built to stand in for a method: lambda, nested def, partial, MethodType, __get__."""
    if isinstance(value, ast.Lambda):
        return True
    if isinstance(value, ast.Name) and value.id in local_defs:
        return True
    if isinstance(value, ast.Call):
        f = value.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        return name in WRAPPERS or name == "__get__"
    return False


def patches(source: str, filename: str = "<src>") -> list[str]:
    """`file:line: code` of every method replacement on another object in `source`."""
    tree = ast.parse(source)
    found: list[str] = []

    def flag(node: ast.AST) -> None:
        found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")

    def scan(scope: ast.AST) -> None:
        body = list(ast.walk(scope))
        local_defs = {n.name for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n is not scope}
        local_defs |= {
            t.id for n in body for t, v in _pairs(n) if isinstance(t, ast.Name) and isinstance(v, ast.Lambda)
        }
        saved = {
            t.id: v.attr
            for n in body
            for t, v in _pairs(n)  # `step = worker.step`
            if isinstance(t, ast.Name) and isinstance(v, ast.Attribute) and not _is_own(v.value)
        }
        for n in body:
            if (
                isinstance(n, ast.Call)
                and isinstance(n.func, ast.Name)
                and n.func.id in ("setattr", "delattr")
                and n.args
                and not _is_own(n.args[0])
            ):
                flag(n)
            for target, value in _pairs(n):
                if (
                    isinstance(target, ast.Subscript)
                    and isinstance(target.value, ast.Attribute)
                    and target.value.attr == "__dict__"
                    and not _is_own(target.value.value)
                ):
                    flag(n)
                if not isinstance(target, ast.Attribute) or _is_own(target.value):
                    continue
                restored = isinstance(value, ast.Name) and saved.get(value.id) == target.attr
                if target.attr in METHOD_SLOTS or _made_callable(value, local_defs) or restored:
                    flag(n)

    scan(tree)
    return sorted(set(found))


def test_detector_flags_patching():
    bad = textwrap.dedent("""
        def run(worker, model, timed):
            step, prefill = worker.step, worker.prefill
            def timed_step(*a):
                return step(*a)
            worker.step, worker.prefill = timed_step, prefill
            model.forward = timed
            setattr(worker, "prefill", timed)
            worker.__dict__["step"] = timed
            worker.step = step
            worker.cb = lambda: 0
            worker.cb2 = functools.partial(print, 1)
            worker.cb3 = types.MethodType(timed, worker)
    """)
    assert len(patches(bad)) == 8, patches(bad)


def test_detector_ignores_plain_assignment():
    fine = textwrap.dedent("""
        class A:
            def __init__(self, model):
                self.model = model
                self.step = self._step
                setattr(self, "x", 1)
            def go(self, d, name):
                d.name = name
                d.settings = dict(a=1)
                cfg.eos_token_id = None
                twin = copy.copy(self)
                twin.layer = torch.compile(self._layer)
    """)
    assert patches(fine) == []


def test_lp_replaces_no_methods():
    found = [
        hit
        for path in sorted((REPO / "lp").rglob("*.py"))
        for hit in patches(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
    ]
    assert not found, "method replacement on another object (use an interface or hook instead):\n" + "\n".join(found)
