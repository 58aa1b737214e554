"""Settings from the environment: errors that say which variable and what it accepts, warnings for typos."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from streamjudge import config
from streamjudge.config import ConfigError, Settings, load_settings, load_settings_or_default


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    # warnings are once per process; each test starts with none given
    monkeypatch.setattr(config, "_warned", set())


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"STREAMJUDGE_ACTION": "bogus"}, "STREAMJUDGE_ACTION='bogus': expected one of flag, regenerate, stop"),
        ({"STREAMJUDGE_MODE": "fast"}, "STREAMJUDGE_MODE='fast': expected one of stream_first, hold_back"),
        ({"STREAMJUDGE_PREFLIGHT_ACTION": "x"},
         "STREAMJUDGE_PREFLIGHT_ACTION='x': expected one of none, warn, skip_checks, stop"),
        ({"STREAMJUDGE_THRESHOLD": "1.5"}, "STREAMJUDGE_THRESHOLD='1.5': expected a number from 0 to 1"),
        ({"STREAMJUDGE_THRESHOLD": "high"}, "STREAMJUDGE_THRESHOLD='high': expected a number"),
        ({"STREAMJUDGE_SAMPLE_RATE": "-1"}, "STREAMJUDGE_SAMPLE_RATE='-1': expected a number from 0 to 1"),
        ({"STREAMJUDGE_CONCURRENCY": "0"}, "STREAMJUDGE_CONCURRENCY='0': expected an integer >= 1"),
        ({"STREAMJUDGE_CHECKPOINT_CHARS": "0"}, "STREAMJUDGE_CHECKPOINT_CHARS='0': expected an integer >= 1"),
        ({"STREAMJUDGE_CHECKPOINT_SENTENCES": "two"},
         "STREAMJUDGE_CHECKPOINT_SENTENCES='two': expected an integer"),
        ({"STREAMJUDGE_PREFLIGHT": "maybe"}, "STREAMJUDGE_PREFLIGHT='maybe': expected true or false"),
        ({"STREAMJUDGE_THRESHOLDS": "faithfulness"}, "STREAMJUDGE_THRESHOLDS: expected metric=value pairs"),
        ({"STREAMJUDGE_THRESHOLDS": "faithfulness=7"}, "values from 0 to 1"),
        ({"STREAMJUDGE_JUDGE": "ragass"},
         "STREAMJUDGE_JUDGE='ragass': expected local, model, llm, ragas, deepeval, cascade or "
         "package.module:ClassName (did you mean 'ragas'?)"),
        ({"STREAMJUDGE_CHECKPOINT_JUDGE": "nli"}, "STREAMJUDGE_CHECKPOINT_JUDGE='nli': expected local"),
    ],
)
def test_every_error_names_the_variable_and_what_it_accepts(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(env)
    assert message in str(err.value)


def test_a_field_set_in_code_is_named_with_its_variable() -> None:
    with pytest.raises(ConfigError, match=r"Settings.action='bogus': expected one of flag, regenerate, stop "
                                          r"\(environment: STREAMJUDGE_ACTION\)"):
        Settings(action="bogus")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="STREAMJUDGE_ACTION"):
        load_settings({}, action="bogus")


def test_enum_values_in_any_case() -> None:
    s = load_settings({"STREAMJUDGE_ACTION": "STOP", "STREAMJUDGE_MODE": "Hold-Back",
                       "STREAMJUDGE_PREFLIGHT_ACTION": " Skip_Checks ", "STREAMJUDGE_JUDGE": "Local"})
    assert (s.action, s.mode, s.preflight_action, s.judge) == ("stop", "hold_back", "skip_checks", "local")
    assert Settings(action="Regenerate").action == "regenerate"  # type: ignore[arg-type]


def test_a_judge_class_path_is_taken_as_written() -> None:
    assert load_settings({"STREAMJUDGE_JUDGE": "my_pkg.judges:Strict"}).judge == "my_pkg.judges:Strict"


def test_unknown_variable_warns_once_with_the_closest_name(caplog: pytest.LogCaptureFixture) -> None:
    env = {"STREAMJUDGE_TRESHOLD": "0.5"}
    with caplog.at_level(logging.WARNING, logger="streamjudge.config"):
        s = load_settings(env)
        load_settings(env)
    assert s.threshold == 0.7  # ignored, as warned
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["streamjudge: unknown variable STREAMJUDGE_TRESHOLD is ignored "
                     "(did you mean 'STREAMJUDGE_THRESHOLD'?)"]


def test_variables_of_the_collector_setup_are_not_unknown(caplog: pytest.LogCaptureFixture) -> None:
    env = {"STREAMJUDGE_COLLECTOR_OTLP_HTTP_ENDPOINT": "127.0.0.1:4318", "STREAMJUDGE_LOW_SCORE_THRESHOLD": "0.5",
           "STREAMJUDGE_TRACES_EXPORTERS": "[otlp_grpc/jaeger]", "STREAMJUDGE_THRESHOLD": "0.6",
           "OTHER_TRESHOLD": "1"}
    with caplog.at_level(logging.WARNING, logger="streamjudge.config"):
        assert load_settings(env).threshold == 0.6
    assert not caplog.records


def test_unknown_metric_warns_with_the_closest_name(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="streamjudge.config"):
        load_settings({"STREAMJUDGE_FINAL_METRICS": "faithfullness,answer_relevancy",
                       "STREAMJUDGE_THRESHOLDS": "context_precison=0.3"})
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "STREAMJUDGE_FINAL_METRICS: unknown metric 'faithfullness' is not scored (did you mean 'faithfulness'?)" \
        in text
    assert "STREAMJUDGE_THRESHOLDS: unknown metric 'context_precison'" in text
    assert "answer_relevancy" not in text.split("known:")[0]
    assert len(caplog.records) == 2


def test_rubric_names_and_own_judges_metrics_are_not_unknown(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="streamjudge.config"):
        load_settings({"STREAMJUDGE_GEVAL_RUBRICS": '{"tone": ["Is it neutral?"]}',
                       "STREAMJUDGE_FINAL_METRICS": "tone,geval_groundedness,faithfulness"})
        load_settings({"STREAMJUDGE_JUDGE": "my.mod:Judge", "STREAMJUDGE_FINAL_METRICS": "toxicity"})
    assert not caplog.records


def test_or_default_keeps_the_good_settings_and_logs_one_line(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.instrumentor")
    env = {"STREAMJUDGE_ACTION": "bogus", "STREAMJUDGE_THRESHOLD": "x", "STREAMJUDGE_MODE": "hold_back",
           "STREAMJUDGE_CHECKPOINT_CHARS": "0"}
    with caplog.at_level(logging.WARNING):
        s = load_settings_or_default(log, env)
    assert (s.action, s.threshold, s.mode, s.window_chars) == ("flag", 0.7, "hold_back", 200)
    mine = [r for r in caplog.records if r.name == "test.instrumentor"]
    assert len(mine) == 1 and mine[0].levelno == logging.ERROR
    line = mine[0].getMessage()
    assert "STREAMJUDGE_ACTION='bogus': expected one of flag, regenerate, stop" in line
    assert "STREAMJUDGE_THRESHOLD='x'" in line and "STREAMJUDGE_CHECKPOINT_CHARS='0'" in line
    assert "(using the default: flag)" in line and "(using the default: 200)" in line and "\n" not in line


def test_or_default_is_silent_when_all_is_well(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        s = load_settings_or_default(env={"STREAMJUDGE_ACTION": "stop"})
    assert s.action == "stop" and not caplog.records


def test_or_default_survives_a_bad_judge_llm_setting() -> None:
    s = load_settings_or_default(env={"EVAL_TIMEOUT": "soon", "STREAMJUDGE_ACTION": "stop"})
    assert s.action == "stop" and s.eval_llm.timeout_s == 30.0


def test_the_warning_reaches_stderr_without_any_logging_setup() -> None:
    # an app that configured no logging still sees the line (Python's last-resort handler)
    code = "import streamjudge.config as c; c.load_settings({'STREAMJUDGE_TRESHOLD': '0.5'})"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "STREAMJUDGE_TRESHOLD is ignored (did you mean 'STREAMJUDGE_THRESHOLD'?)" in p.stderr


def test_the_judge_names_accepted_are_the_built_in_judges() -> None:
    from streamjudge.judging import judges

    assert set(config.JUDGE_NAMES) == set(judges._BUILTIN)


# --- every setting's range, from the table that the settings reference is made of ---------------------

@pytest.mark.parametrize(
    ("var", "raw", "expected", "default"),
    [
        ("STREAMJUDGE_CHECKPOINT_EVERY", "-1", "an integer >= 0", "0"),
        ("STREAMJUDGE_END_WAIT", "nan", "a number >= 0", "2"),
        ("STREAMJUDGE_END_WAIT", "-1", "a number >= 0", "2"),
        ("STREAMJUDGE_END_WAIT", "inf", "a number >= 0", "2"),
        ("STREAMJUDGE_HOLD_TIMEOUT", "-1", "a number > 0", "60"),
        ("STREAMJUDGE_HOLD_TIMEOUT", "0", "a number > 0", "60"),
        ("STREAMJUDGE_MAX_QUEUE_CHARS", "-1", "an integer >= 1", "64000000"),
        ("STREAMJUDGE_MAX_JUDGE_INPUT_CHARS", "-1", "an integer >= 1", "2000000"),
        ("STREAMJUDGE_STREAM_BUDGET", "-1", "an integer >= 0", "64"),
        ("STREAMJUDGE_MAX_TEXT_CHARS", "0", "an integer >= 16", "16384"),
        ("STREAMJUDGE_JUDGE_TIMEOUT", "nan", "a number > 0", "30"),
        ("STREAMJUDGE_MODEL_BACKEND", "bogus", "one of auto, onnx, torch", "auto"),
        ("STREAMJUDGE_JUDGE_PROCESSES", "100000000000000000000", "an integer from 0 to 64, or auto", "auto"),
        ("STREAMJUDGE_JUDGE_PROCESSES", "-2", "an integer from 0 to 64, or auto", "auto"),
        ("STREAMJUDGE_RETRY_BACKOFF", "-0.5", "a number >= 0", "0.2"),
        ("STREAMJUDGE_PREFLIGHT_WAIT", "nan", "a number >= 0", "0.05"),
        ("STREAMJUDGE_MAX_RETRIES", "-1", "an integer >= 0", "2"),
        ("STREAMJUDGE_JUDGE_CPU_SHARE", "nan", "a number from 0 to 1", "0.15"),
        ("STREAMJUDGE_MODEL_BATCH_SIZE", "0", "an integer >= 1", "16"),
        ("EVAL_TIMEOUT", "nan", "a number > 0", "30"),
        ("EVAL_CHECKPOINT_INPUT_COST_PER_MTOK", "-3", "a number >= 0", "0"),
    ],
)
def test_a_value_outside_its_range_is_refused_naming_the_variable_and_the_range(
    var: str, raw: str, expected: str, default: str, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings({var: raw})
    assert str(err.value).startswith(f"{var}={raw!r}: expected {expected}")
    # zero-code: one error line that says which default is used instead, and the defaults apply
    with caplog.at_level(logging.ERROR):
        s = load_settings_or_default(env={var: raw})
    assert s == Settings()
    (line,) = [r.getMessage() for r in caplog.records]
    assert f"{var}={raw!r}: expected {expected} (using the default: {default})" in line


def test_the_same_bad_setting_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        for _ in range(3):  # the configurator, the instrumentor, instrument_app
            load_settings_or_default(env={"STREAMJUDGE_END_WAIT": "nan"})
    assert len(caplog.records) == 1


def test_a_bad_judge_llm_variable_keeps_the_other_judge_llm_settings() -> None:
    s = load_settings_or_default(env={"EVAL_TIMEOUT": "-1", "EVAL_MODEL": "m1", "EVAL_PROVIDER": "openai"})
    assert (s.eval_llm.timeout_s, s.eval_llm.model, s.eval_llm.provider) == (30.0, "m1", "openai")
    assert s.checkpoint_llm.model == "m1"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("checkpoint_every", -1, "Settings.checkpoint_every=-1: expected an integer >= 0 "
                                 "(environment: STREAMJUDGE_CHECKPOINT_EVERY)"),
        ("end_wait_s", float("nan"), "Settings.end_wait_s=nan: expected a number >= 0"),
        ("hold_timeout_s", 0.0, "expected a number > 0 (environment: STREAMJUDGE_HOLD_TIMEOUT)"),
        ("judge_processes", 10**20, "expected an integer from 0 to 64, or auto"),
        ("model_backend", "bogus", "expected one of auto, onnx, torch"),
        ("window_chars", "200", "expected an integer >= 1"),
        ("capture_content", "false", "expected true or false"),
    ],
)
def test_a_field_set_in_code_is_checked_against_the_same_range(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        Settings(**{field: value})  # type: ignore[arg-type]
    assert message in str(err.value)


def test_values_at_the_edges_of_their_ranges_are_taken() -> None:
    s = load_settings({"STREAMJUDGE_CHECKPOINT_EVERY": "0", "STREAMJUDGE_END_WAIT": "0",
                       "STREAMJUDGE_STREAM_BUDGET": "0", "STREAMJUDGE_JUDGE_PROCESSES": "64",
                       "STREAMJUDGE_MAX_TEXT_CHARS": "16", "STREAMJUDGE_HOLD_TIMEOUT": "0.001",
                       "STREAMJUDGE_MODEL_BACKEND": "ONNX"})
    assert (s.checkpoint_every, s.end_wait_s, s.per_stream_budget, s.judge_processes) == (0, 0.0, 0, 64)
    assert (s.max_text_attribute_chars, s.hold_timeout_s, s.model_backend) == (16, 0.001, "onnx")


def test_shutdown_timeout_is_an_option_not_an_unknown_variable(caplog: pytest.LogCaptureFixture) -> None:
    from streamjudge import _deadline

    with caplog.at_level(logging.WARNING):
        load_settings({"STREAMJUDGE_SHUTDOWN_TIMEOUT": "3"})
    assert not caplog.records
    assert _deadline.shutdown_timeout_s({"STREAMJUDGE_SHUTDOWN_TIMEOUT": "3"}) == 3.0
    with caplog.at_level(logging.ERROR):
        assert _deadline.shutdown_timeout_s({"STREAMJUDGE_SHUTDOWN_TIMEOUT": "-1"}) == 5.0
    assert "STREAMJUDGE_SHUTDOWN_TIMEOUT='-1': expected a number >= 0 (using the default: 5)" in caplog.text
    assert config.option("STREAMJUDGE_SHUTDOWN_TIMEOUT").default == _deadline.DEFAULT_SHUTDOWN_TIMEOUT_S


def test_every_settings_field_with_a_variable_has_one_option_and_its_default() -> None:
    import dataclasses

    options = config.all_options()
    assert len({o.var for o in options}) == len(options)
    fields = {f.name for f in dataclasses.fields(Settings)}
    code_only = {"regenerate_instruction", "eval_llm", "checkpoint_llm"}
    assert {o.field for o in config.OPTIONS} == fields - code_only
    for o in options:
        assert o.doc and o.type_name and o.accepts, o.var
        if o.field in fields:
            assert o.default == getattr(Settings(), o.field), o.var
        if o.low is not None or o.high is not None:
            assert o.kind in ("int", "float", "processes"), o.var
    assert set(config.known_env_vars()) == {o.var for o in options if o.var.startswith("STREAMJUDGE_")}


def test_a_bad_shutdown_timeout_is_said_at_start_up_once(caplog: pytest.LogCaptureFixture) -> None:
    from streamjudge import _deadline

    env = {"STREAMJUDGE_SHUTDOWN_TIMEOUT": "nan"}
    with pytest.raises(ConfigError, match="STREAMJUDGE_SHUTDOWN_TIMEOUT='nan'"):
        load_settings(env)
    with caplog.at_level(logging.ERROR):
        load_settings_or_default(env=env)  # at start-up
        assert _deadline.shutdown_timeout_s(env) == 5.0  # at shutdown: the default, not said again
    assert [r.getMessage() for r in caplog.records] == [
        "streamjudge: STREAMJUDGE_SHUTDOWN_TIMEOUT='nan': expected a number >= 0 (using the default: 5)"]


def test_a_judge_llm_setting_in_code_is_checked_like_its_variable() -> None:
    with pytest.raises(ConfigError, match=r"JudgeLLMSettings.timeout_s=nan: expected a number > 0 "
                                          r"\(environment: EVAL_TIMEOUT / EVAL_CHECKPOINT_TIMEOUT\)"):
        config.JudgeLLMSettings(timeout_s=float("nan"))
    with pytest.raises(ConfigError, match="input_cost_per_mtok=-1"):
        config.JudgeLLMSettings(input_cost_per_mtok=-1)
    assert config.JudgeLLMSettings(timeout_s=5).timeout_s == 5


def test_the_scale_out_gateway_s_variables_are_not_warned_as_unknown(caplog: pytest.LogCaptureFixture) -> None:
    env = {"STREAMJUDGE_GATEWAY_OTLP_GRPC_ENDPOINT": "127.0.0.1:4317",
           "STREAMJUDGE_WORKER_ENDPOINTS": "w1:4317", "STREAMJUDGE_WORKER_RETRY_MAX_ELAPSED": "30s",
           "STREAMJUDGE_GATEWAY_TYPO_THAT_IS_STILL_A_GATEWAY_VAR": "x"}
    with caplog.at_level(logging.WARNING, logger="streamjudge"):
        load_settings(env)
    assert not [r for r in caplog.records if "unknown variable" in r.getMessage()]
