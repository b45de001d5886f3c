import pytest

from modak_lib.validate import (parse_mail_events, parse_walltime, pbs_walltime, slurm_walltime)


@pytest.mark.parametrize("text, seconds", [
    (3600, 3600), ("3600", 3600), ("01:00:00", 3600), ("12:00:00 ", 43200), ("90:00", 5400),
    ("1-06:00:00", 108000), ("PT2H", 7200), ("P1DT6H", 108000), ("PT90M", 5400),
    ("30:00:00", 108000), ("5", 5), ("1-06", 108000), ("1-06:30", 109800),
])
def test_walltime_parses(text, seconds):
    assert parse_walltime(text) == seconds


@pytest.mark.parametrize("bad", ["", "P", "PT", "1 day, 6:00:00", "12:61:00", "10:75", "-5", 0, True,
                                 "01:00:00; rm -rf /", "abc"])
def test_walltime_rejects(bad):
    with pytest.raises(ValueError):
        parse_walltime(bad)


@pytest.mark.parametrize("seconds, slurm, pbs", [
    (59, "00:00:59", "00:00:59"),
    (3600, "01:00:00", "01:00:00"),
    (86399, "23:59:59", "23:59:59"),
    (86400, "1-00:00:00", "24:00:00"),
    (108000, "1-06:00:00", "30:00:00"),
    (3 * 86400 + 61, "3-00:01:01", "72:01:01"),
])
def test_walltime_formats_a_day_or_more(seconds, slurm, pbs):
    assert slurm_walltime(seconds) == slurm
    assert pbs_walltime(seconds) == pbs
    assert parse_walltime(slurm) == seconds  # what we render, we read back


@pytest.mark.parametrize("value, events", [
    ("abe", ("begin", "end", "fail")), ("a", ("fail",)), ("be", ("begin", "end")),
    ("BEGIN,END", ("begin", "end")), ("FAIL", ("fail",)), ("ALL", ("begin", "end", "fail")),
    ("NONE", ()), ("n", ()), (None, ()), (True, ("begin", "end", "fail")),
    (("end", "begin"), ("begin", "end")),
])
def test_mail_events_normalise(value, events):
    assert parse_mail_events(value) == events


@pytest.mark.parametrize("bad", ["abx", "BEGIN,LATER", 3])
def test_mail_events_reject(bad):
    with pytest.raises(ValueError):
        parse_mail_events(bad)
