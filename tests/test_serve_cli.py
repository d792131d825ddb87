"""`python -m lp.serve`'s checks before anything loads: each bad key is one LPError line, and a
port that another process holds is refused before the model loads."""

from __future__ import annotations

import socket

import pytest
from hydra import compose, initialize_config_dir

from lp.errors import LPError
from lp.frontend import cli
from lp.serve.__main__ import bind, check


def config(*overrides: str):
    with initialize_config_dir(str(cli.CONFIGS), version_base=None):
        return compose("serve", overrides=list(overrides))


def test_the_defaults_pass():
    assert check(config())["W"] == "auto"


@pytest.mark.parametrize(
    "override,message",
    [
        ("port=-1", "port must be an integer >= 0, got -1"),
        ("port=70000", "port must be at most 65535, got 70000"),
        ("max_queue=0", "max_queue must be an integer >= 1, got 0"),
        ("max_body_bytes=big", "max_body_bytes must be an integer >= 1, got 'big'"),
        ("timeout_s=2", "timeout_s must be > 4"),
        ("W=0", "W must be an integer >= 1, got 0"),
        ("temperature=-1", "temperature must be a finite number >= 0"),
        ("step_tokens=1", "step_tokens must be an integer >= "),
        ("api_key=''", "api_key must not be empty"),
    ],
)
def test_a_bad_key_is_one_error(override, message):
    with pytest.raises(LPError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        check(config(override))


def test_a_port_in_use_is_refused():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(LPError, match=f"cannot serve on 127.0.0.1:{port}: "):
            bind("127.0.0.1", port)
