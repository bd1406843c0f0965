"""The five --speculative-ddtree-* flags through SGLang's own ServerArgs, and DDTREE's resolution:
what it refuses (each message), and what it declares next to DFLASH's own handler."""

from __future__ import annotations

import pickle

import pytest

BASE = ["--model-path", "/nonexistent/target", "--device", "cuda", "--speculative-algorithm", "DDTREE"]
# What every accepted DDTREE run needs on SGLang 0.5.23; single tests break one of them.
GOOD = ["--attention-backend", "triton", "--page-size", "1", "--disable-overlap-schedule", "--disable-cuda-graph"]
BRIEF_DEFAULTS = {
    "speculative_ddtree_budget": 15,
    "speculative_ddtree_topk": 8,
    "speculative_ddtree_spine_depth": 0,
    "speculative_ddtree_hybrid_mode": "safe",
    "speculative_ddtree_allow_hybrid_unsafe": False,
}


def test_flags_are_serverargs_fields_with_their_defaults(parse):
    from sglang.srt.arg_groups.arg_utils import namespace_of, record_fields

    record = parse(BASE)
    fields = {f.name for f in record_fields(type(record))}
    assert set(BRIEF_DEFAULTS) <= fields
    assert {name: getattr(record, name) for name in BRIEF_DEFAULTS} == BRIEF_DEFAULTS
    # They join SGLang's `spec` namespace, so the published config bag carries them too.
    assert {name: namespace_of(type(record))[name] for name in BRIEF_DEFAULTS} == dict.fromkeys(BRIEF_DEFAULTS, "spec")


def test_flags_parse_and_survive_the_pickle_to_the_scheduler_process(parse):
    record = parse(
        BASE
        + [
            "--speculative-ddtree-budget", "31",
            "--speculative-ddtree-topk", "4",
            "--speculative-ddtree-spine-depth", "2",
            "--speculative-ddtree-hybrid-mode", "unsafe",
            "--speculative-ddtree-allow-hybrid-unsafe",
        ]
    )
    expected = {
        "speculative_ddtree_budget": 31,
        "speculative_ddtree_topk": 4,
        "speculative_ddtree_spine_depth": 2,
        "speculative_ddtree_hybrid_mode": "unsafe",
        "speculative_ddtree_allow_hybrid_unsafe": True,
    }
    assert {name: getattr(record, name) for name in expected} == expected
    copy = pickle.loads(pickle.dumps(record))
    assert type(copy) is type(record)
    assert {name: getattr(copy, name) for name in expected} == expected


def test_hybrid_mode_is_a_closed_choice(parse, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(BASE + ["--speculative-ddtree-hybrid-mode", "fast"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'fast'" in capsys.readouterr().err


# (extra argv, the fragment the refusal must contain)
REFUSALS = {
    "budget 0": (["--speculative-ddtree-budget", "0"], "--speculative-ddtree-budget must be >= 1"),
    "topk 0": (["--speculative-ddtree-topk", "0"], "--speculative-ddtree-topk must be >= 1"),
    "negative spine": (
        ["--speculative-ddtree-spine-depth", "-1"],
        "--speculative-ddtree-spine-depth must be between 0 and the budget (15)",
    ),
    "spine past the budget": (
        ["--speculative-ddtree-budget", "3", "--speculative-ddtree-spine-depth", "4"],
        "--speculative-ddtree-spine-depth must be between 0 and the budget (3)",
    ),
    "unsafe without the allow flag": (
        ["--speculative-ddtree-hybrid-mode", "unsafe"],
        "unsafe reproduces sibling state leakage and corrupts output on hybrid models: use safe (or spine), "
        "or add --speculative-ddtree-allow-hybrid-unsafe",
    ),
    "fa3": (
        ["--attention-backend", "fa3"],
        "the attention backend is 'fa3': DDTREE verifies a tree through a custom ancestor mask, "
        "which triton supports and fa3 does not",
    ),
    "split backends": (
        ["--decode-attention-backend", "flashinfer"],
        "the decode attention backend is 'flashinfer': DDTREE verifies a tree through a custom ancestor mask, "
        "which triton supports and flashinfer does not (its custom-mask verify is not validated with DDTREE); "
        "set --decode-attention-backend triton",
    ),
    "page size 16": (
        ["--page-size", "16"],
        "--page-size is 16: the tree's KV slots are kept or dropped one token at a time; set --page-size 1",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_sglang_resolution_refuses_each_bad_setting_saying_what_to_change(resolve_step, case):
    extra, fragment = REFUSALS[case]
    argv = BASE + GOOD + extra
    with pytest.raises(ValueError) as refused:
        resolve_step(argv)
    message = str(refused.value)
    assert message.startswith("DDTREE cannot start with these settings:\n- ")
    assert fragment in message
    assert message.count("\n- ") == 1  # this setting alone is refused


def test_overlap_schedule_and_an_unset_backend_are_refused_together(resolve_step):
    # Without GOOD: SGLang's overlap schedule is on by default, and this step sees no backend.
    with pytest.raises(ValueError) as refused:
        resolve_step(BASE)
    message = str(refused.value)
    assert message.count("\n- ") == 2
    assert "CUDA graph" not in message
    assert "the overlap schedule is on: the DDTREE worker runs synchronously; add --disable-overlap-schedule" in message
    assert "the attention backend is unset" in message and "set --attention-backend triton" in message


def test_good_settings_pass_into_dflash_resolution(resolve_step):
    # DDTREE's checks pass, so the step goes on to DFLASH's, which needs a drafter.
    with pytest.raises(ValueError, match=r"^DDTREE runs SGLang's DFLASH drafter and cannot start: DFLASH speculative "
                                         r"decoding requires setting --speculative-draft-model-path"):
        resolve_step(BASE + GOOD)
    # CUDA graphs on (SGLang's default) pass DDTREE's checks too: the worker captures the tree mask.
    with pytest.raises(ValueError, match="requires setting --speculative-draft-model-path"):
        resolve_step(BASE + [a for a in GOOD if a != "--disable-cuda-graph"])
    # The allow flag lets unsafe through the same way.
    with pytest.raises(ValueError, match="requires setting --speculative-draft-model-path"):
        resolve_step(BASE + GOOD + ["--speculative-ddtree-hybrid-mode", "unsafe", "--speculative-ddtree-allow-hybrid-unsafe"])


def _drafted(tmp_path, block_size: int) -> list[str]:
    # The path is not read: an explicit block size spares _handle_dflash the drafter's config.
    return ["--speculative-draft-model-path", str(tmp_path / "draft"), "--speculative-dflash-block-size", str(block_size)]


def test_spine_deeper_than_the_drafters_block_is_refused(resolve_registered, tmp_path):
    with pytest.raises(ValueError) as refused:
        resolve_registered(BASE + GOOD + _drafted(tmp_path, 4) + ["--speculative-ddtree-spine-depth", "4"])
    assert str(refused.value) == (
        "DDTREE cannot start with these settings:\n- --speculative-ddtree-spine-depth 4 is deeper than the tree: "
        "the drafter's block 4 drafts 3 depths; use at most 3"
    )
    record = resolve_registered(BASE + GOOD + _drafted(tmp_path, 4) + ["--speculative-ddtree-spine-depth", "3"])
    assert record.speculative_ddtree_spine_depth == 3


@pytest.mark.parametrize(
    ("block_size", "budget", "reserve"),
    [(8, 15, 16), (16, 32, 33), (16, 7, 16), (16, 15, 16)],
)
def test_kv_reserve_covers_block_and_verify_width_and_topk_reaches_sglang(resolve_registered, tmp_path, block_size, budget, reserve):
    from sglang.srt.arg_groups.overrides import resolution_result

    record = resolve_registered(
        BASE + GOOD + _drafted(tmp_path, block_size) + ["--speculative-ddtree-budget", str(budget), "--speculative-ddtree-topk", "4"]
    )
    assert resolution_result(record, "speculative_num_draft_tokens") == reserve  # max(block, budget + 1)
    # _handle_dflash declared topk 1; DDTREE's later declaration wins (SGLang's hybrid backend
    # walks parent-indexed trees only at topk > 1).
    assert resolution_result(record, "speculative_eagle_topk") == 4
    assert record.speculative_eagle_topk is None  # declared, not written over the operator's input


def test_ddtree_declares_everything_dflash_declares(parse, resolve_registered, tmp_path):
    """Field by field, DDTREE's resolution equals DFLASH's own handler on the same input, but for
    the two fields DDTREE sets on purpose."""
    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    common = GOOD + _drafted(tmp_path, 8) + ["--model-path", "/nonexistent/target", "--device", "cuda"]
    dflash = parse(common + ["--speculative-algorithm", "DFLASH"])
    SpeculativeAlgorithm.DFLASH.handle_server_args(dflash)  # the in-tree dispatcher -> _handle_dflash
    ddtree = resolve_registered(common + ["--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "15"])

    declared_by_dflash = {name for _source, fields in dflash._resolved_overrides for name in fields}
    assert {"speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
            "speculative_draft_attention_backend", "max_running_requests"} <= declared_by_dflash
    differ = {
        name: (resolution_result(dflash, name), resolution_result(ddtree, name))
        for name in declared_by_dflash
        if resolution_result(dflash, name) != resolution_result(ddtree, name)
    }
    assert differ == {"speculative_num_draft_tokens": (8, 16), "speculative_eagle_topk": (1, 8)}


@pytest.fixture
def resolve_with_graphs(parse, tmp_path):
    """SGLang's CUDA-graph resolution up to the speculative step (its handler, then the decode batch sizes as
    `handle_gpu_memory_settings` materializes them on a 141 GB GPU), then DDTREE's two calls; returns the resolved
    max_running_requests, decode graph config, and that config before the speculative step."""
    from sglang.srt.arg_groups.cuda_graph_hook import generate_decode_cuda_graph_batch_sizes, handle_cuda_graph_config
    from sglang.srt.arg_groups.overrides import declare_resolution, record_foreign_defaults, resolution_result, resolving_view
    from sglang.srt.arg_groups.resolution_hooks import run_hook
    from sglang.srt.model_executor.cuda_graph_config import with_phase
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    def _resolve(budget: int, *extra: str):
        good = [a for a in GOOD if a != "--disable-cuda-graph"]
        record = parse(BASE + good + _drafted(tmp_path, 16) + ["--speculative-ddtree-budget", str(budget), *extra])
        run_hook(handle_cuda_graph_config, record)
        decode = resolving_view(record).cuda_graph_config.decode
        # SGLang's default on a 141 GB GPU, cut to an operator's --max-running-requests (memory_hook.py).
        max_bs = decode.max_bs or min(256, record.max_running_requests or 256)
        materialized = with_phase(resolving_view(record).cuda_graph_config, "decode", max_bs=max_bs,
                                  bs=decode.bs or generate_decode_cuda_graph_batch_sizes(record, max_bs))
        declare_resolution(record, "_handle_gpu_memory_settings", cuda_graph_config=materialized)
        algo = SpeculativeAlgorithm.from_string("DDTREE")
        record_foreign_defaults(record, "handle_speculative_decoding.custom_validate", algo.validate_server_args)
        record_foreign_defaults(record, "handle_speculative_decoding.custom_algo", algo.handle_server_args)
        return (resolution_result(record, "max_running_requests"), resolution_result(record, "cuda_graph_config").decode,
                materialized.decode)

    return _resolve


def test_a_wide_tree_runs_as_many_requests_at_once_as_2048_verify_rows_hold(resolve_with_graphs, caplog):
    from ddtree_engine.sglang_plugin.spec import STEP_MAX_ROWS

    assert STEP_MAX_ROWS == 2048
    # Budget 128: 129 rows a request, 15 requests (1,935 rows); SGLang's graphs stop at the running cap by themselves.
    with caplog.at_level("INFO", logger="ddtree_engine.sglang_plugin.spec"):
        running, decode, before = resolve_with_graphs(128)
    assert running == 15 and decode == before
    assert "DDTREE: at most 15 requests at once (129 verify rows a request" in caplog.text
    assert resolve_with_graphs(256)[0] == 7  # 257 rows
    assert resolve_with_graphs(47)[0] == 42  # 48 rows
    # At DFLASH's width and up to 41 drafted nodes (42 rows x 48 requests fit), DFLASH's 48 and SGLang's graphs stay.
    for budget in (15, 41):
        running, decode, before = resolve_with_graphs(budget)
        assert running == 48 and decode == before


def test_more_requests_set_by_the_operator_capture_graphs_up_to_the_row_cap_only(resolve_with_graphs):
    running, decode, before = resolve_with_graphs(128, "--max-running-requests", "48")
    assert running == 48 and max(before.bs) == 48
    assert decode.bs == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 15] and decode.max_bs == 15  # SGLang's list up to 15, and 15
    running, decode, _ = resolve_with_graphs(256, "--max-running-requests", "20")
    assert running == 20 and decode.bs == [1, 2, 3, 4, 5, 6, 7] and decode.max_bs == 7
    running, decode, before = resolve_with_graphs(128, "--max-running-requests", "10")  # under the cap: as SGLang has it
    assert running == 10 and decode == before


def test_an_operators_graph_batch_sizes_are_kept_at_any_width(resolve_with_graphs):
    _, decode, _ = resolve_with_graphs(128, "--max-running-requests", "48", "--cuda-graph-max-bs-decode", "32")
    assert decode.max_bs == 32 and max(decode.bs) == 32
    _, decode, _ = resolve_with_graphs(128, "--max-running-requests", "48", "--cuda-graph-bs-decode", "1", "2", "64")
    assert decode.bs == [1, 2, 64]
