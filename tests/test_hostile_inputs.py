"""Hostile inputs through `modak plan`, under a guard.

Each case is a set of files someone else could hand a user (a blueprint, its inputs, an
infrastructure file, files beside them) and the `modak plan` arguments that read them. The
plan runs in this process (``main([...])``) with an audit hook armed: any process start,
network connection or name lookup, or a file opened for writing outside ``--out`` fails the
case. Every case must end in one of two ways: refused (exit status 2, one line per problem,
no control character, no traceback, nothing written) or rendered inert (the plan succeeds
and the hostile value reaches the job script only as data).
"""
import json
import os
import resource
import shlex
import sys
import threading
from pathlib import Path

import pytest
from conftest import ROOT

from modak_lib.cli import main

TYPES = str(ROOT / "tosca/modak-types.yaml")
GUARD = threading.local()
FORBIDDEN = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
             "os.fork", "socket.connect", "socket.getaddrinfo", "socket.gethostbyname",
             "urllib.Request"}


def _audit(event, args):
    allowed = getattr(GUARD, "out", None)
    if allowed is None:
        return
    if event in FORBIDDEN:
        GUARD.violations.append(f"{event} {str(args)[:200]}")
        raise PermissionError(f"guard: {event}")
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        mode, flags = args[1], args[2]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
            (isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
        path = os.path.realpath(os.fsdecode(args[0]))
        if writing and not path.startswith(allowed + os.sep) and path != allowed:
            GUARD.violations.append(f"write {path}")
            raise PermissionError(f"guard: write outside --out: {path}")


sys.addaudithook(_audit)  # (an audit hook cannot be removed: it is armed per case only)


def blueprint(job_props: str = "", target_props: str = "", *, imports: str = None,
              inputs: str = "", extra: str = "", node: str = "train") -> str:
    imports = imports if imports is not None else f"  - {TYPES}\n"
    return f"""tosca_definitions_version: tosca_simple_yaml_1_3
imports:
{imports}{extra}topology_template:
  inputs:
    steps: {{type: string, default: "10"}}
{inputs}  node_templates:
    hpc:
      type: modak.nodes.HPCTarget
      properties:
        scheduler: slurm
{target_props}    {node}:
      type: modak.nodes.AITrainingJob
      properties:
        application:
          framework: pytorch
          script: train.py
          arguments: [--steps, {{get_input: steps}}]
{job_props}      requirements:
        - host: hpc
"""


def dsl(**job) -> str:
    doc = {"job": {
        "job_options": {"job_name": "train", "wall_time_limit": "01:00:00", "core_count": 4},
        "application": {"executable": "python3 train.py", "arguments": "--steps 10"},
        "target": {"job_scheduler_type": "slurm"},
        "optimisation": {"enable_opt_build": True, "app_type": "ai_training",
                         "app_type-ai_training": {"config": {"ai_framework": "pytorch"},
                                                  "ai_framework-pytorch": {"version": "2.13"}}}}}
    for dotted, value in job.items():
        node = doc["job"]
        *parents, last = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return json.dumps(doc)


def alias_bomb(levels=8, width=9):
    lines = ["a0: &a0 [" + ",".join(["x"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def merge_bomb(levels=40):
    lines = ["m0: &m0 {a: 1, b: 2}"]
    for i in range(1, levels):
        lines.append(f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}], k{i}: {i}}}")
    return "\n".join(lines) + "\n"


def deep_yaml(depth=5000):
    return "a: " + "[" * depth + "]" * depth + "\n"


BIG = "9" * 5000
R = "refused"
I = "inert"   # noqa: E741 (the plan succeeds, the value is data)

# name -> (files {name: text}, extra plan arguments, expected, text the error must contain)
CASES = {
    # --- TOSCA imports reaching outside the blueprint
    "import-absolute": ({"bp.yaml": blueprint(imports=f"  - {TYPES}\n  - /etc/hostname\n")},
                        [], R, "imports[1]"),
    "import-dotdot": ({"bp.yaml": blueprint(imports=f"  - {TYPES}\n  - ../../../etc/x.yaml\n")},
                      [], R, "outside the blueprint's directory"),
    "import-file-url": ({"bp.yaml": blueprint(imports="  - file:///etc/passwd\n")}, [], R,
                        "only a relative file"),
    "import-http": ({"bp.yaml": blueprint(imports="  - http://127.0.0.1:9/x.yaml\n")}, [], R,
                    "only a relative file"),
    "import-https": ({"bp.yaml": blueprint(imports="  - https://example.org/t.yaml\n")}, [], R,
                     "only a relative file"),
    "import-home": ({"bp.yaml": blueprint(imports="  - ~/types.yaml\n")}, [], R,
                    "only a relative file"),
    "import-mapping-url": ({"bp.yaml": blueprint(
        imports="  - extra: {file: 'http://127.0.0.1:9/t.yaml'}\n")}, [], R, "only a relative"),
    "import-repository": ({"bp.yaml": blueprint(
        imports="  - {file: t.yaml, repository: hub}\n")}, [], R, "repository import"),
    "repositories-section": ({"bp.yaml": blueprint(
        extra="repositories:\n  hub: {url: 'http://127.0.0.1:9/'}\n")}, [], R,
        "repositories are not used"),
    "import-nested-escape": ({"bp.yaml": blueprint(imports=f"  - {TYPES}\n  - lib.yaml\n"),
                              "lib.yaml": "tosca_definitions_version: tosca_simple_yaml_1_3\n"
                                          "imports:\n  - ../../../../etc/t.yaml\n"},
                             [], R, "outside the blueprint's directory"),
    "import-nested-url": ({"bp.yaml": blueprint(imports=f"  - {TYPES}\n  - lib.yaml\n"),
                           "lib.yaml": "tosca_definitions_version: tosca_simple_yaml_1_3\n"
                                       "imports:\n  - http://127.0.0.1:9/t.yaml\n"},
                          [], R, "lib.yaml: imports[0]"),
    "import-symlink-out": ({"bp.yaml": blueprint(imports=f"  - {TYPES}\n  - link.yaml\n"),
                            "link.yaml": ("symlink", "/etc/hostname")}, [], R,
                           "outside the blueprint's directory"),
    "import-windows-drive": ({"bp.yaml": blueprint(imports="  - 'C:/types.yaml'\n")}, [], R,
                             "only a relative file"),
    "import-not-a-list": ({"bp.yaml": blueprint(imports="  x: y\n")}, [], R, "imports"),
    # --- denial of service: bombs and nesting in every kind of input
    "alias-bomb-blueprint": ({"bp.yaml": blueprint() + alias_bomb()}, [], R, "values once"),
    "alias-bomb-inputs": ({"bp.yaml": blueprint(), "in.yaml": alias_bomb()},
                          ["--inputs", "in.yaml"], R, "values once"),
    "alias-bomb-infra": ({"bp.yaml": blueprint(), "infra.yaml": alias_bomb()},
                         ["--infra", "infra.yaml"], R, "values once"),
    "alias-count": ({"bp.yaml": blueprint() + "x: &x 1\ny: [" + ",".join(["*x"] * 2000) + "]\n"},
                    [], R, "YAML aliases"),
    # PyYAML before 6.0.4 repeats a merged key once per path to it (2^40 pairs here), and
    # MODAK refuses that; 6.0.4 merges each key once, so the file is small and meets the
    # ordinary checks: either way, a one-line refusal in bounded time and memory
    "merge-bomb-blueprint": ({"bp.yaml": blueprint() + merge_bomb()}, [], R,
                             ("merge keys", 'unknown field "m0"')),
    "merge-bomb-inputs": ({"bp.yaml": blueprint(), "in.yaml": merge_bomb()},
                          ["--inputs", "in.yaml"], R, ("merge keys", "no input named 'm0'")),
    "merge-bomb-infra": ({"bp.yaml": blueprint(), "infra.yaml": merge_bomb()},
                         ["--infra", "infra.yaml"], R, ("merge keys", "m0: unknown key")),
    "inputs-undeclared": ({"bp.yaml": blueprint(), "in.yaml": "stepz: '5'\n"},
                          ["--inputs", "in.yaml"], R,
                          "topology_template.inputs: no input named 'stepz' (given as an input; "
                          "the blueprint declares: steps)"),
    "deep-yaml": ({"bp.yaml": blueprint() + deep_yaml()}, [], R, "nested"),
    "deep-json-dsl": ({"r.json": "[" * 5000 + "]" * 5000}, [], R, "nested"),
    "deep-inputs": ({"bp.yaml": blueprint(), "in.yaml": deep_yaml(200)},
                    ["--inputs", "in.yaml"], R, "nested more than"),
    "huge-file": ({"bp.yaml": blueprint() + "# " + "x" * (5 * 2 ** 20) + "\n"}, [], R,
                  "MODAK reads at most"),
    "compiler-modes-many": ({"r.json": dsl(**{
        "optimisation__app_type-ai_training__ai_framework-pytorch__compile":
            [f"mode-{i}" for i in range(400)]})}, [], R, "at most 8"),
    "compiler-modes-repeated": ({"r.json": dsl(**{
        "optimisation__app_type-ai_training__ai_framework-pytorch__compile":
            ["default"] * 8})}, [], I, None),
    "compiler-mode-hostile": ({"r.json": dsl(**{
        "optimisation__app_type-ai_training__ai_framework-pytorch__compile":
            ["default; rm -rf ~"]})}, [], R, "torch.compile mode"),
    # --- numbers
    "int-5000-digits-json": ({"r.json": dsl().replace('"core_count": 4', f'"core_count": {BIG}')},
                             [], R, "cannot read a value"),
    "int-5000-digits-yaml": ({"bp.yaml": blueprint(target_props=f"        cores_per_node: {BIG}\n")},
                             [], R, "cannot read a value"),
    "float-1e308": ({"r.json": dsl().replace('"core_count": 4', '"core_count": 1e308')}, [], R,
                    "number too large"),
    "infinity-json": ({"r.json": dsl().replace('"core_count": 4', '"core_count": Infinity')},
                      [], R, "Infinity is not a number"),
    "nan-json": ({"r.json": dsl().replace('"core_count": 4', '"core_count": NaN')}, [], R,
                 "NaN is not a number"),
    "minus-infinity": ({"r.json": dsl().replace('"core_count": 4', '"core_count": -Infinity')},
                       [], R, "not a number"),
    "inf-yaml": ({"bp.yaml": blueprint(target_props="        cores_per_node: .inf\n")}, [], R,
                 "not a number"),
    "node-count-1e18": ({"r.json": dsl(job_options__node_count=10 ** 18)}, [], R,
                        "node_count"),
    "node-count-over-limit": ({"r.json": dsl(job_options__node_count=200_000)}, [], R,
                              "less than or equal to 100000"),
    "gpus-over-limit": ({"r.json": dsl(job_options__request_gpus=10_000)}, [], R,
                        "request_gpus"),
    "cores-over-limit": ({"bp.yaml": blueprint(target_props="        cores_per_node: 100000\n")},
                         [], R, "cores_per_node"),
    "walltime-huge": ({"r.json": dsl(job_options__wall_time_limit="999999999:00:00")}, [], R,
                      "wall time"),
    "walltime-long-string": ({"r.json": dsl(job_options__wall_time_limit="1" * 5000)}, [], R,
                             "wall time"),
    # --- get_input with the wrong kind of argument
    "get-input-list2": ({"bp.yaml": blueprint().replace("{get_input: steps}",
                                                        "{get_input: [steps, x]}")}, [], R,
                        "get_input"),
    "get-input-mapping": ({"bp.yaml": blueprint().replace("{get_input: steps}",
                                                          "{get_input: {a: b}}")}, [], R,
                          "get_input"),
    "get-input-empty-list": ({"bp.yaml": blueprint().replace("{get_input: steps}",
                                                             "{get_input: []}")}, [], R,
                             "get_input"),
    "get-input-number": ({"bp.yaml": blueprint().replace("{get_input: steps}",
                                                         "{get_input: 5}")}, [], R, "get_input"),
    # --- environment names a shell or the loader acts on
    **{f"env-{name}": ({"r.json": dsl(environment={name: "touch /tmp/pwned"})}, [], R,
                       "refused") for name in
       ("BASH_ENV", "ENV", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PROMPT_COMMAND",
        "SHELLOPTS", "PS4", "IFS", "PYTHONSTARTUP", "BASH_FUNC_x")},
    "env-bad-name": ({"r.json": dsl(environment={"A-B": "1"})}, [], R,
                     "environment variable name"),
    # --- values that are data: they must reach the script as data
    "args-dash-torchrun": ({"r.json": dsl(
        job_options__process_count_per_node=2, job_options__node_count=1,
        target={"job_scheduler_type": "none"},
        application={"executable": "python3 train.py",
                     "arguments": "--rdzv-endpoint=evil:1 -m evil --no-python"})}, [], I,
        None),
    "args-dash-srun": ({"r.json": dsl(application={"executable": "python3 train.py",
                                                   "arguments": "--export=ALL -o /etc/x"})},
                       [], I, None),
    "env-value-commas": ({"r.json": dsl(environment={"A": "x,LD_PRELOAD=/tmp/evil.so"})}, [], I,
                         None),
    "env-value-subshell": ({"r.json": dsl(environment={"A": "$(touch /tmp/pwned)`id`"})}, [], I,
                           None),
    "args-newline": ({"r.json": dsl(application={"executable": "python3 train.py",
                                                 "arguments": ["a\nrm -rf ~", "$(id)"]})},
                     [], I, None),
    # --- names and messages: escapes and sizes
    "node-name-escape": ({"bp.yaml": blueprint(node="'train\x1b[2J\x1b[1;1Hok'")}, [], R, None),
    "job-name-escape": ({"r.json": dsl(job_options__job_name="x\x1b[2Jdone")}, [], R,
                        "job name"),
    "job-name-10mb": ({"r.json": dsl(job_options__job_name="x" * (3 * 2 ** 20))}, [], R,
                      "job name"),
    "job-name-newline": ({"r.json": dsl(job_options__job_name="a\nb")}, [], R, "job name"),
    "job-name-subshell": ({"r.json": dsl(job_options__job_name="$(id)")}, [], R, "job name"),
    "partition-backtick": ({"r.json": dsl(job_options__partition="`id`")}, [], R, "partition"),
    "script-dotdot": ({"r.json": dsl(application={"executable": "python3 ../../x.py"})}, [], R,
                      "'..' is not allowed"),
    "script-dash": ({"r.json": dsl(application={"executable": "-c evil"})}, [], R, None),
    # (an absolute script was taken for a name in the request's directory: the whole of it,
    # a home perhaps, went to the run directory, and the job ran the front-end's file)
    "script-absolute": ({"r.json": dsl(application={"executable": "python3 /etc/passwd"})},
                        [], R, "'/etc/passwd' must be relative to the request file's"),
    "files-absolute": ({"r.json": dsl(application={"executable": "python3 train.py",
                                                   "files": ["/root/.ssh"]})}, [], R,
                       "application.files"),
    "not-a-mapping": ({"r.json": "[1, 2, 3]"}, [], R, None),
    # a key written twice: the last would win, unseen by a reader of the first
    "yaml-key-twice": ({"bp.yaml": blueprint("        job_options:\n          job_name: a\n"
                                             "          job_name: b\n")}, [], R,
                       "the key 'job_name' is written twice in one mapping (line"),
    "json-key-twice": ({"r.json": dsl().replace('"job": {', '"job": {"target": {}, ', 1)}, [],
                       R, "the key 'target' is written twice in one JSON object"),
    "version-garbage": ({"r.json": dsl(**{
        "optimisation__app_type-ai_training__ai_framework-pytorch__version": "2.x.y"})}, [], R,
        "r.json: job.optimisation.app_type-ai_training.ai_framework-*.version: invalid version"),
    "binary-garbage": ({"bp.yaml": "\udcff"}, [], R, None),
    # --- --out holding links where MODAK writes
    "out-link-job": ({"r.json": dsl(), "out/job.sh": ("symlink", "/tmp/modak-victim")}, [], R,
                     "symbolic link"),
    "out-link-plan": ({"r.json": dsl(), "out/plan.json": ("symlink", "/tmp/modak-victim")},
                      [], R, "symbolic link"),
    "out-is-link": ({"r.json": dsl(), "out": ("symlink", "/tmp")}, [], R, "symbolic link"),
}


def _write(base: Path, files: dict) -> None:
    for name, content in files.items():
        path = base / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, tuple):
            path.symlink_to(content[1])
        elif "\udcff" in content:
            path.write_bytes(b"\xff\xfe\x00garbage")
        else:
            path.write_text(content)


def test_the_suite_is_large_enough():
    assert len(CASES) >= 60


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_input(name, tmp_path, capsys, monkeypatch):
    files, extra, expected, message = CASES[name]
    _write(tmp_path, {"train.py": "print('the user script')\n", **files})
    request = next(n for n in files if n.endswith((".yaml", ".json")) and not n.startswith(
        ("in.", "infra.", "lib.", "link.", "out")))
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path)
    victim = Path("/tmp/modak-victim")
    before = victim.read_bytes() if victim.exists() else None
    GUARD.violations = []
    GUARD.out = os.path.realpath(out)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        code = main(["plan", request, "--out", "out", "--model", "none", *extra])
    finally:
        GUARD.out = None
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024
    stdout, stderr = capsys.readouterr()
    assert GUARD.violations == [], GUARD.violations
    assert grown_mb < 500
    assert (victim.read_bytes() if victim.exists() else None) == before
    assert "Traceback" not in stderr
    assert not any(ch in stderr for ch in "\x1b\x07\r")
    if expected == R:
        assert code == 2, (stdout, stderr)
        assert stderr.startswith("modak: error: ")
        assert all(line.startswith("modak: error: ") and len(line) < 1200
                   for line in stderr.splitlines())
        if message:
            assert any(m in stderr for m in (
                message if isinstance(message, tuple) else (message,))), stderr
        assert not (out.is_dir() and not out.is_symlink() and
                    [p for p in out.iterdir() if not p.is_symlink()])
    else:
        assert code == 0, stderr
        script = (out / "job.sh").read_text()
        _inert(name, script, files)


def _inert(name: str, script: str, files: dict) -> None:
    words = shlex.split(script, comments=True)
    if name == "args-dash-torchrun":
        from torch.distributed.run import get_args_parser
        start = words.index("torchrun")
        args = get_args_parser().parse_args(words[start + 1:words.index("modak_rc=$?")])
        assert args.no_python and args.training_script == "python3" and not args.module
        assert args.rdzv_endpoint == "" and "--rdzv-endpoint=evil:1" in args.training_script_args
    elif name == "args-dash-srun":
        # srun's options end at the program: the user's words follow python3 and the script
        # (the application's python3: a probe of the target may run python3 before it)
        app = next(i for i, w in enumerate(words)
                   if w == "python3" and words[i + 1:i + 4] == ["-m", "modak_runtime", "--"])
        assert words[app + 4:][:3] == ["train.py", "--export=ALL", "-o"]
    elif name == "compiler-modes-repeated":
        plan = json.loads(Path("out/plan.json").read_text())
        compilers = [c["configuration"]["compiler"] for c in plan["candidates"]]
        assert compilers.count("torch.compile:default") == len(
            {json.dumps(c["configuration"], sort_keys=True) for c in plan["candidates"]
             if c["configuration"]["compiler"] == "torch.compile:default"})
    elif name == "env-value-commas":
        # one variable whose value has a comma (Apptainer's --env would split it in two)
        assert any(w.endswith("A=x,LD_PRELOAD=/tmp/evil.so") for w in words)
        assert not any(w.startswith("LD_PRELOAD=/tmp/evil") for w in words)
    elif name == "env-value-subshell":
        assert any(w.endswith("=$(touch /tmp/pwned)`id`") for w in words)
    elif name == "args-newline":
        at = words.index("train.py")
        assert words[at + 1:at + 3] == ["a\nrm -rf ~", "$(id)"]
