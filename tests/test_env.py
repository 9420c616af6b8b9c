"""Every RINGCOMM_* variable is parsed in one place: a bad value is a UsageError naming the
variable, the value and what is accepted; an empty value means unset; unknown names are refused."""
import numpy as np
import pytest

from ringcomm import UsageError, env
from ringcomm.testing import run_threads

BAD = {
    "RINGCOMM_BACKEND": "bogus",
    "RINGCOMM_TIMEOUT": "abc",
    "RINGCOMM_MPI_INIT_TIMEOUT": "-1",
    "RINGCOMM_TRANSPORT": "carrier-pigeon",
    "RINGCOMM_ALGO": "all_reduce=butterfly",
    "RINGCOMM_DEBUG": "bogus",
    "RINGCOMM_CHECK_FINITE": "maybe",
    "RINGCOMM_FLIGHT_RECORDER": "0",
    "RINGCOMM_SHM_CMA": "maybe",
    "RINGCOMM_SHM_CMA_MIN": "-5",
    "RINGCOMM_SHM_CMA_P2P_MIN": "64 kilobytes",
    "RINGCOMM_SHM_POOL": "lots",
    "RINGCOMM_SHM_UNSAFE_ORDERING": "perhaps",
    "RINGCOMM_FAULT": "nonsense",
    "RINGCOMM_COMPILED": "fast",
}
FREE_TEXT = {"RINGCOMM_NODE_ID", "RINGCOMM_TUNING_FILE", "RINGCOMM_TIMELINE"}   # any text is a value


def test_every_variable_has_a_bad_value_here_unless_any_text_is_valid():
    assert set(BAD) | FREE_TEXT == set(env.VARIABLES)


@pytest.mark.parametrize("name,value", sorted(BAD.items()))
def test_a_bad_value_names_the_variable_the_value_and_what_is_accepted(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(UsageError) as info:
        env.get(name)
    message = str(info.value)
    assert name in message and repr(value) in message
    if name not in ("RINGCOMM_ALGO", "RINGCOMM_FAULT", "RINGCOMM_SHM_CMA_MIN", "RINGCOMM_SHM_CMA_P2P_MIN",
                    "RINGCOMM_SHM_POOL"):
        assert env.VARIABLES[name].accepted in message, message
    with pytest.raises(UsageError, match=name):
        env.check_all()


@pytest.mark.parametrize("name", sorted(env.VARIABLES))
def test_an_empty_value_means_unset(monkeypatch, name):
    monkeypatch.setenv(name, "")
    assert env.get(name) == env.VARIABLES[name].fallback
    monkeypatch.setenv(name, "   ")
    assert env.get(name) == env.VARIABLES[name].fallback


@pytest.mark.parametrize("text,expected", [("0", False), ("no", False), ("off", False), ("FALSE", False),
                                           ("1", True), ("yes", True), ("On", True), ("true", True)])
def test_booleans_mean_what_they_say(monkeypatch, text, expected):
    monkeypatch.setenv("RINGCOMM_CHECK_FINITE", text)   # "no" used to turn the check ON
    assert env.get("RINGCOMM_CHECK_FINITE") is expected


def test_a_misspelt_variable_is_refused_with_a_suggestion(monkeypatch):
    monkeypatch.setenv("RINGCOMM_TIMOUT", "5")
    with pytest.raises(UsageError, match="RINGCOMM_TIMOUT.*did you mean RINGCOMM_TIMEOUT"):
        env.check_all()


def test_a_communicator_refuses_a_bad_debug_level_before_any_call(monkeypatch):
    monkeypatch.setenv("RINGCOMM_DEBUG", "bogus")
    with pytest.raises(UsageError, match="RINGCOMM_DEBUG='bogus'"):
        run_threads(2, lambda comm: comm.all_reduce(np.ones(2)))


def test_the_reliability_doc_holds_the_table():
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[1] / "docs" / "reliability.md").read_text()
    for line in env.table().splitlines()[2:]:
        assert line in doc, f"docs/reliability.md lacks: {line}"


@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "-inf"])
@pytest.mark.parametrize("name", ["RINGCOMM_SHM_POOL", "RINGCOMM_SHM_CMA_MIN", "RINGCOMM_SHM_CMA_P2P_MIN"])
def test_sizes_beyond_any_integer_are_a_usage_error_naming_the_variable(monkeypatch, name, value):
    """int(float("inf")) raises OverflowError: it escaped the UsageError these variables promise."""
    monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match=name):
        env.get(name)
