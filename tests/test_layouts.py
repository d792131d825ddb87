"""tools.layouts' cost model of a tensor-parallel group: the fit reproduces the published
speedups it is fitted to, one GPU costs what it measured, and every layout of the GPU counts
is priced."""

from tools.layouts import PUBLISHED_TP, GroupModel, fit, price


def test_fit_reproduces_the_published_speedups():
    model = fit()
    step1 = 1e3 / PUBLISHED_TP[1]
    for T, tok_s in PUBLISHED_TP.items():
        predicted = step1 / model.step_ms(step1, T, 1)
        assert abs(predicted - tok_s / PUBLISHED_TP[1]) < 0.05 * tok_s / PUBLISHED_TP[1], T
    assert 0 < model.a < 0.5 and 0 < model.lat_ms < 0.05


def test_one_gpu_is_the_measured_step_and_more_tokens_cost_more():
    model = GroupModel(0.2, 0.004, 150.0)
    assert model.step_ms(8.0, 1, 100) == 8.0
    assert model.step_ms(8.0, 4, 128) > model.step_ms(8.0, 4, 1)


def test_every_layout_is_priced():
    rows = [
        {
            "P": P,
            "W": 5 * P,
            "N": 3,
            "G": 5 * P,
            "S": 2.0 + P / 10,
            "slowest_rank_ms_mean": 8.0,
            "slowest_rank_tokens_mean": 100.0,
            "ar_tok_s": 150.0,
        }
        for P in (1, 2, 4)
    ]
    priced = price(rows, fit(), [1, 2, 4], allgather_ms=0.05)
    layouts = [(x["gpus"], x["T"], x["P"]) for x in priced]
    assert layouts == [(1, 1, 1), (2, 1, 2), (2, 2, 1), (4, 1, 4), (4, 2, 2), (4, 4, 1)]
    assert priced[0]["tok_s"] == rows[0]["S"] / 8.0 * 1e3
    assert priced[0]["tp_ar_tok_s"] == 150.0
