"""``rlkit launch`` on CPU: every preset composed with verl 0.9.1's packaged config and validated by verl's
own checks; clear failures for bad names; the printed command equal to the composed overrides; batch
arithmetic for 1–16 GPUs; metrics written by verl's own file logger where rlkit reads them; the book page
up to date with the presets."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

pytestmark = pytest.mark.verl
pytest.importorskip("verl")
pytest.importorskip("hydra")

from omegaconf import OmegaConf  # noqa: E402

from rlkit import cli  # noqa: E402
from rlkit.lab import book_pages  # noqa: E402
from rlkit.metrics import metrics_frame  # noqa: E402
from rlkit.verl.launch import config as C  # noqa: E402
from rlkit.verl import launch as L  # noqa: E402
from rlkit.verl.launch import presets as P  # noqa: E402

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
BOOK_PAGE = Path(__file__).resolve().parent.parent / "book" / "full_scale_runs.md"


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing here may reach the hub


def _launch_args(method="grpo", dataset="gsm8k", *extra, gpus=2):
    return ["launch", "--method", method, "--dataset", dataset, "--model", MODEL, "--gpus", str(gpus), *extra]


# ------------------------------------------------------------------------------------------------ presets
_CHECKED: dict[tuple[str, str], tuple[L.Plan, object]] = {}


def checked(method: str, dataset: str):
    """``(plan, composed config)`` of the book's run of ``method`` on ``dataset``, validated once."""
    if (method, dataset) not in _CHECKED:
        model, gpus, nodes = book_pages.BOOK_RUNS[dataset][method]
        p = L.plan(method, dataset, model, gpus=gpus, nodes=nodes, ray_address="HEAD:6379" if nodes > 1 else None)
        _CHECKED[method, dataset] = p, L.check(p)
    return _CHECKED[method, dataset]


@pytest.mark.parametrize("dataset", list(book_pages.BOOK_RUNS))
@pytest.mark.parametrize("method", P.METHODS)
def test_every_preset_composes_and_validates(method, dataset):
    """Each method on each dataset, with the model and GPUs the book's page shows."""
    p, cfg = checked(method, dataset)
    preset, batch = P.PRESETS[method], P.scaled_batch(method, dataset, p.gpus * p.nodes)
    actor = cfg.actor_rollout_ref.actor
    assert cfg.algorithm.adv_estimator == preset.keys["algorithm.adv_estimator"]
    assert actor.policy_loss.loss_mode == preset.keys["actor_rollout_ref.actor.policy_loss.loss_mode"]
    assert cfg.trainer.v1.trainer_mode == "rlkit"
    assert (cfg.data.train_batch_size, actor.ppo_mini_batch_size, cfg.actor_rollout_ref.rollout.n) == \
        (batch.prompts, batch.mini_batch, batch.n)
    assert cfg.data.train_batch_size // actor.ppo_mini_batch_size == preset.updates
    assert "file" in cfg.trainer.logger
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH == f"{p.run_dir}/verl_metrics.jsonl"
    assert OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves (main_ppo resolves them)


def test_paper_values_reach_verl():
    actor = checked("gspo", "dapo")[1].actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (3e-4, 4e-4)  # GSPO v2 §5.1
    assert actor.loss_agg_mode == "seq-mean-token-mean"
    cfg = checked("aspo", "dapo")[1]
    assert (cfg.algorithm.aspo.delta, cfg.algorithm.aspo.k) == (-2.0, 0.7)  # ASPO §4.5
    assert (cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n) == (96, 8)  # ASPO §4.1
    assert cfg.data.max_response_length == cfg.reward.reward_kwargs.max_resp_len == 16384
    assert cfg.actor_rollout_ref.rollout.multi_turn.enable and cfg.trainer.total_epochs == 3
    cfg = checked("hapo", "dapo")[1]
    assert (cfg.data.train_batch_size, cfg.actor_rollout_ref.actor.ppo_mini_batch_size) == (512, 32)
    assert cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes == 32  # 32×A100
    cfg = checked("spo", "gsm8k")[1]  # one GPU
    assert cfg.actor_rollout_ref.rollout.n == 1 and cfg.data.train_batch_size == P.GSM8K_SAMPLES_PER_GPU


# ------------------------------------------------------------------------------------------------ failures
@pytest.mark.parametrize("extra, named", [
    (["actor_rollout_ref.actor.clip_ratio_lo=0.1"], "clip_ratio_low"),  # unknown verl key: the close one
    (["+algorithm.aspo.dleta=-2.5"], "dleta"),  # unknown rlkit field
    (["+algorithm.gspo.clip_low=1e-3"], "clip_ratio_low"),  # an rlkit field that verl owns
    (["+algorithm.gpso.variant=token"], "gpso"),  # a method block that does not exist
    (["actor_rollout_ref.actor.policy_loss.loss_mode=rlkit_gpso"], "rlkit_gpso"),
    (["algorithm.adv_estimator=rlkit_grpoo"], "rlkit_grpoo"),
    (["+actor_rollout_ref.rollout.adaptive_temperature=true"], "adaptive_temperature"),  # RolloutConfig
    (["actor_rollout_ref.actor.ppo_mini_batch_size=4096"], "ppo_mini_batch_size"),  # ActorConfig.validate
    (["reward.reward_manager.name=dapoo"], "dapoo"),
    (["reward.custom_reward_function.path=pkg://rlkit.tasks.dapo_math",
      "reward.custom_reward_function.name=scor"], "scor"),  # verl loads the score function by name
    (["trainer.logger=[console]"], "file"),
])
def test_bad_override_fails_naming_it(extra, named):
    with pytest.raises(P.LaunchError, match=named):
        L.check(L.plan("gspo", "gsm8k", MODEL, gpus=2, extra=extra))


@pytest.mark.parametrize("method, dataset, extra, named", [
    ("hapo", "dapo", ["data.max_response_length=2048"], "overlong_buffer"),  # verl's DAPO reward manager
    ("spo", "gsm8k", ["actor_rollout_ref.rollout.n=4"], "rollout.n=1"),  # the rlkit trainer's own check
    ("aspo", "gsm8k", ["actor_rollout_ref.rollout.agent.default_agent_loop=tool_agnt"], "tool_agnt"),
])
def test_method_specific_checks(method, dataset, extra, named):
    with pytest.raises(P.LaunchError, match=named):
        L.check(L.plan(method, dataset, MODEL, gpus=2, extra=extra))


@pytest.mark.parametrize("method, dataset", [("ppo", "gsm8k"), ("grpo", "math")])
def test_unknown_method_or_dataset_fails_naming_it(method, dataset, capsys):
    bad = method if method == "ppo" else dataset
    with pytest.raises(P.LaunchError, match=f"'{bad}'.*valid"):
        L.plan(method, dataset, MODEL, gpus=1)
    with pytest.raises(SystemExit):
        cli.main(_launch_args(method, dataset, "--dry-run"))
    assert f"'{bad}'" in capsys.readouterr().err


def test_cli_reports_a_bad_key_without_a_traceback():
    with pytest.raises(SystemExit, match="rlkit launch: .*clip_ratio_lo"):
        cli.main(_launch_args("grpo", "gsm8k", "--dry-run", "--", "actor_rollout_ref.actor.clip_ratio_lo=1"))


# ------------------------------------------------------------------------------------------------ the command
def test_dry_run_prints_the_composed_overrides(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a dry run checks the data a launch would read
    (tmp_path / "data" / "gsm8k").mkdir(parents=True)
    for name in ("train.parquet", "test.parquet"):
        (tmp_path / "data" / "gsm8k" / name).write_bytes(b"")
    extra = ["trainer.total_epochs=2", "+algorithm.gspo.variant=token"]
    assert cli.main(_launch_args("gspo", "gsm8k", "--dry-run", "--", *extra)) == 0
    words = shlex.split(capsys.readouterr().out.replace("\\\n", " "))
    assert words[:3] == ["python", "-m", "verl.trainer.main_ppo"]
    p = L.plan("gspo", "gsm8k", MODEL, gpus=2, extra=extra)
    assert words[3:] == list(p.overrides)
    printed = C.compose(words[3:])
    assert printed.trainer.total_epochs == 2 and printed.algorithm.gspo.variant == "token"
    assert sum(w.lstrip("+").startswith("trainer.total_epochs=") for w in words) == 1  # replaced in place


def test_user_overrides_replace_the_preset_in_place():
    base = ["a.b=1", "+c.d=2", "e=3"]
    merged = C.merge_overrides(base, ["c.d=5", "+a.b=7", "f=1", "~e"])
    assert merged == ["a.b=7", "+c.d=5", "e=3", "f=1", "~e"]
    with pytest.raises(P.LaunchError, match="'oops'"):
        C.merge_overrides(base, ["oops"])


def test_values_round_trip_through_hydra():
    values = [True, None, 3, 1e-6, 3e-4, "Qwen/Qwen2.5-0.5B-Instruct", "a b", "x'y", "1.5", "true", "null",
              ["console", "file"], "/abs/path=odd,name", "${data.max_response_length}"]
    probes = [f"+probe.v{i}={C.hydra_value(v)}" for i, v in enumerate(values)]
    cfg = C.compose([*probes, "data.max_response_length=7"])
    got = OmegaConf.to_container(cfg, resolve=True)["probe"]
    assert [got[f"v{i}"] for i in range(len(values))] == [*values[:-1], 7]


# ------------------------------------------------------------------------------------------------ GPU scaling
def _dotlist_config(p: L.Plan):
    return OmegaConf.from_dotlist([o.lstrip("+") for o in p.overrides if "${" not in o])


def test_batches_split_as_verl_requires():
    """Every preset on every dataset and GPU count: the batch verl needs (its validate_config's rules, checked on
    the composed config by ``L.check`` above, and those it asserts only on the workers, :func:`C.check_batch`),
    with the preset's optimizer steps and the scaling the presets promise. One case: the arithmetic is the
    presets', not verl's (verl's own checks are not re-tested here)."""
    for method in P.METHODS:
        for dataset in P.DATASETS:
            for gpus, nodes in [(1, 1), (2, 1), (8, 1), (8, 2), (16, 1)]:
                p = L.plan(method, dataset, MODEL, gpus=gpus, nodes=nodes,
                           ray_address="HEAD:6379" if nodes > 1 else None)
                cfg = _dotlist_config(p)
                arr = cfg.actor_rollout_ref
                prompts, mini, n = cfg.data.train_batch_size, arr.actor.ppo_mini_batch_size, arr.rollout.n
                case = (method, dataset, gpus, nodes)
                assert (prompts * n) % (gpus * nodes) == 0, case  # validate_config's real_train_batch_size
                assert prompts // mini == P.PRESETS[method].updates, case
                if dataset == "gsm8k":
                    assert prompts * n == P.GSM8K_SAMPLES_PER_GPU * gpus * nodes, case  # samples per GPU fixed
                else:
                    assert prompts == P.PRESETS[method].dapo_prompts, case  # the paper's batch, any GPU count
                C.check_batch(cfg)


def test_a_gpu_count_that_cannot_split_the_papers_batch_is_refused():
    # 6 prompts × 8 over 32 GPUs
    cfg = _dotlist_config(L.plan("aspo", "dapo", MODEL, gpus=8, nodes=4, ray_address="HEAD:6379"))
    with pytest.raises(P.LaunchError, match=r"6 × 8 = 48 samples do not split over 32"):
        C.check_batch(cfg)
    with pytest.raises(P.LaunchError, match="do not split over 3 data-parallel ranks"):
        C.check_batch(_dotlist_config(L.plan("grpo", "dapo", MODEL, gpus=3)))


# ------------------------------------------------------------------------------------------------ run
def test_metrics_land_where_rlkit_reads_them(tmp_path, monkeypatch):
    """verl's own FileLogger, pointed at the path launch hands to Ray, writes lines that the watchdog's relay
    copies into the metrics.jsonl rlkit.metrics reads."""
    from verl.utils.tracking import FileLogger

    from rlkit.verl.launch.runner import _Relay

    monkeypatch.chdir(tmp_path)
    p = L.plan("grpo", "gsm8k", MODEL, gpus=1)
    cfg = C.compose(p.overrides)
    Path(p.run_dir).mkdir(parents=True)
    env = cfg.ray_kwargs.ray_init.runtime_env.env_vars  # what Ray hands verl's trainer actor
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", env.VERL_FILE_LOGGER_PATH)
    relay = _Relay(Path(p.run_dir), after=None)
    logger = FileLogger(cfg.trainer.project_name, cfg.trainer.experiment_name)
    logger.log({"critic/score/mean": 0.25, "actor/pg_clipfrac": float("nan")}, step=1)
    assert [r["step"] for r in relay.poll()] == [1]
    logger.log({"critic/score/mean": 0.5, "actor/pg_clipfrac": 0.01}, step=2)
    logger.finish()
    assert [r["step"] for r in relay.poll()] == [2]
    relay.close()
    frame = metrics_frame(Path(p.run_dir) / "metrics.jsonl")
    assert frame["critic/score/mean"].tolist() == [0.25, 0.5]
    assert frame.index.tolist() == [1, 2]


def test_run_checks_inputs_and_never_clobbers_metrics(tmp_path, monkeypatch):
    from rlkit.verl.launch.runner import Result
    from rlkit.verl.tools import TOOL_CONFIG

    monkeypatch.chdir(tmp_path)
    calls = []
    monkeypatch.setattr(L, "_execute", lambda argv, **kw: calls.append((argv, kw)) or Result(0, "finished", [], None, 1.0))
    args = _launch_args("aspo", "gsm8k", "--experiment", "t1")
    with pytest.raises(SystemExit, match="train.parquet not found.*rlkit data gsm8k"):
        cli.main(args)
    (tmp_path / "data" / "gsm8k").mkdir(parents=True)
    for name in ("train.parquet", "test.parquet"):
        (tmp_path / "data" / "gsm8k" / name).write_bytes(b"")
    assert cli.main(args) == 0
    argv, kwargs = calls[0]
    planned = L.plan("aspo", "gsm8k", MODEL, gpus=2, experiment="t1")
    assert argv[1:] == [*planned.command[1:], "hydra.run.dir=runs/t1/hydra"]  # Hydra's files go into the run
    assert kwargs["resume_after"] is None and kwargs["limits"] == L.GPU_LIMITS and kwargs["env"] == {}
    run_dir = tmp_path / "runs" / "t1"
    config = json.loads((run_dir / "config.json").read_text())
    assert config["method"] == "aspo" and config["verl"]["trainer"]["experiment_name"] == "t1"
    assert json.loads((run_dir / "env.json").read_text())["gpus"] == 2
    assert (run_dir / L.TOOL_CONFIG_NAME).read_text() == TOOL_CONFIG.read_text()  # the tools the run used
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "data": {}}\n')
    with pytest.raises(SystemExit, match="metrics.jsonl exist.*--resume"):
        cli.main(args)
    assert len(calls) == 1
    assert cli.main([*args[:1], "--resume", *args[1:]]) == 0  # no checkpoint yet: from scratch, verl told so
    assert calls[1][1]["resume_after"] is None and "trainer.resume_mode=disable" in calls[1][0]


# ------------------------------------------------------------------------------------------------ the book
def test_book_page_commands_are_todays_presets():
    text = BOOK_PAGE.read_text()
    assert book_pages.update_book_page(text) == text, "book/full_scale_runs.md is stale: regenerate (update_book_page)"
    shown = {(m, d) for _, m, d in book_pages._BLOCK.findall(text) if m}
    assert shown == {(m, d) for d in book_pages.BOOK_RUNS for m in P.METHODS}
    assert "<!-- rlkit presets -->" in text


def test_a_failed_launch_says_why_in_one_line(tmp_path, monkeypatch, capsys):
    """main_ppo's traceback stays in launch.json and launch.log; the terminal gets one line with its cause."""
    from rlkit.verl.launch.runner import PHASES, Result

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "gsm8k").mkdir(parents=True)
    for name in ("train.parquet", "test.parquet"):
        (tmp_path / "data" / "gsm8k" / name).write_bytes(b"")
    error = ("Traceback (most recent call last):\n  File \"main_ppo.py\", line 93, in run_ppo\n"
             "ray.exceptions.RayTaskError(NoSignalLeft): ray::TaskRunnerV1.run() (pid=8)\n"
             "  File \"trainer.py\", line 150, in __call__\nrlkit.errors.NoSignalLeft: no group has signal")
    monkeypatch.setattr(L, "_execute", lambda argv, **kw: Result(1, "failed", [], error, 110.0,
                                                                 phases=[(PHASES[1][0], 9.0), ("step 1", 60.0)]))
    assert cli.main(_launch_args("grpo", "gsm8k", "--experiment", "r1")) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("rlkit launch: main_ppo failed after 110 s in phase: step 1 (exit 1): "
                          "rlkit.errors.NoSignalLeft: no group has signal — its traceback: "), err
    assert err.endswith(str(Path("runs") / "r1" / "launch.log")), err


def test_ray_failing_to_start_is_tried_again_then_named(tmp_path, monkeypatch, capsys):
    from rlkit.verl.launch.runner import PHASES, Result

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(L, "RAY_RETRY_PAUSE_S", 0.0)
    (tmp_path / "data" / "gsm8k").mkdir(parents=True)
    for name in ("train.parquet", "test.parquet"):
        (tmp_path / "data" / "gsm8k" / name).write_bytes(b"")
    ray_failed = Result(1, "failed", [], "Traceback (most recent call last):\nException: The current node timed out "
                        "during startup. This could happen because ...", 31.0, phases=[(PHASES[1][0], 9.0)])
    outcomes = iter([ray_failed, ray_failed, Result(0, "finished", [1], None, 60.0)])
    calls = []
    monkeypatch.setattr(L, "_execute", lambda argv, **kw: calls.append(argv) or next(outcomes))
    assert cli.main(_launch_args("grpo", "gsm8k", "--experiment", "r1")) == 0
    out = capsys.readouterr().out
    assert len(calls) == 3 and out.count("Ray did not start its local node") == 2 and "finished in 60 s" in out

    monkeypatch.setattr(L, "_execute", lambda argv, **kw: calls.append(argv) or ray_failed)
    assert cli.main(_launch_args("grpo", "gsm8k", "--experiment", "r2")) == 1
    err = capsys.readouterr().err
    assert len(calls) == 3 + L.RAY_START_TRIES
    assert f"Ray could not start its local node in {L.RAY_START_TRIES} tries" in err and "load average" in err
    assert "Traceback" not in err
