"""Runs several Atropos env files' `process` (or `evaluate`) in ONE atroposlib interpreter (saves its import time).

Usage (in atroposlib's venv): `python atropos_reference_driver.py JOBS.json` (tests/atropos_conformance.py), where
JOBS.json is a list of {"env_file", "out", "argv"[, "command"]}, or `python atropos_reference_driver.py -`: the jobs
one JSON line at a time on stdin, each started when the caller is ready for it (tests/test_atropos_corpus_runs.py).
Prints one JSON line per job: {"env_file", "ok", "error"}. Each job runs as `python ENV.py COMMAND ARGV...` would
(COMMAND: "process" unless given): in `out`, as `__main__`, its folder first on sys.path.
"""

import json
import os
import random
import runpy
import sys
import traceback


def run(job):
    os.makedirs(job["out"], exist_ok=True)
    os.chdir(job["out"])
    sys.argv = [job["env_file"], job.get("command", "process"), *job["argv"]]
    sys.path.insert(0, os.path.dirname(job["env_file"]))  # as `python ENV.py` does: its folder's modules import
    try:
        runpy.run_path(job["env_file"], run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (0, None):
            return f"exit {exc.code}"
    except BaseException:
        return traceback.format_exc()[-3000:]
    finally:
        sys.path.remove(os.path.dirname(job["env_file"]))
    return None


if __name__ == "__main__":
    if os.environ.get("ATROPOS_CORPUS_STANDINS"):  # datasets loaded by name get the corpus test's stand-in rows
        import atropos_corpus_data

        atropos_corpus_data.install()
    if sys.argv[1] == "-":  # one job per stdin line, each started when the caller is ready for it
        jobs = (json.loads(line) for line in sys.stdin)
    else:
        with open(sys.argv[1]) as f:
            jobs = json.load(f)
    for job in jobs:
        if os.environ.get("ATROPOS_CORPUS_SEED"):  # files that draw from `random` draw the same in both runs
            random.seed(int(os.environ["ATROPOS_CORPUS_SEED"]))
        error = run(job)
        print(json.dumps({"env_file": job["env_file"], "ok": error is None, "error": error}), flush=True)
