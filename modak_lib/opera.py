"""Deploy any MODAK request with xOpera, from an installed MODAK (``modak opera``).

xOpera deploys a CSAR (a zip of TOSCA files) and resolves nothing outside it; its
operations run the collection's playbooks (``tosca/playbooks`` of the installed
``modak.modak``), which read the application's files relative to the CSAR's root
(``MODAK_CSAR_ROOT``).  So, for a blueprint or a DSL document anywhere:

* the request is read as ``modak plan`` reads it (its inputs, ``--infra``'s hardware under
  the target's own properties), and refused with the same one-line errors before xOpera
  starts;
* the CSAR's entry is written from that request: a target node with its properties and a
  job node with its application, job options, optimisation and environment, every value
  literal (xOpera resolves no function inside a list: a blueprint's ``arguments: [--steps,
  {get_input: steps}]`` reach it resolved), and the outputs of the run (run id, chosen
  configuration, predicted and measured step time, job state, results);
* beside it the installed types and the collection's playbooks, and the files the run
  directory receives, at the paths the job reads them at.

The CSAR and xOpera's state live in the user's MODAK directory (``opera/NAME-HASH/``, one
per request file), so ``outputs`` and ``undeploy`` find the deployment of that file.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Optional

import yaml

from . import __version__
from .errors import ModakError
from .models import JobRequest
from .paths import user_dir

ACTIONS = ("validate", "deploy", "outputs", "undeploy")
INSTALL_OPERA = ("pip install --no-deps opera==0.7.0 opera-tosca-parser==0.2.2 shtab "
                 "'setuptools<81' (xOpera 0.7.0's own PyYAML pin does not build on Python "
                 "3.11; MODAK's dependencies are what it needs)")
OUTPUTS = {"run_id": "run_id", "chosen_configuration": "chosen_configuration",
           "decided_by": "decided_by", "predicted_seconds_per_step": "predicted_seconds",
           "image": "image", "job_id": "job_id", "job_state": "job_state",
           "measured_seconds_per_step": "measured_seconds", "results_dir": "results_dir"}


def instance_dir(request_file: Path) -> Path:
    """Where the CSAR and xOpera's state of ``request_file`` live."""
    path = request_file.resolve()
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", path.stem)[:40] or "request"
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return user_dir("opera") / f"{name}-{digest}"


def collection_playbooks() -> Path:
    """The installed ``modak.modak`` collection's TOSCA playbooks (where Ansible finds the
    collection: ``ANSIBLE_COLLECTIONS_PATH`` or its configured paths, then ``sys.path``)."""
    roots: list[str] = []
    try:
        from ansible import constants

        roots += list(constants.COLLECTIONS_PATHS)
    except Exception:  # (no ansible-core here: the error below says what to install)
        pass
    roots += sys.path
    for root in roots:
        found = Path(root, "ansible_collections", "modak", "modak", "tosca", "playbooks")
        if (found / "job-create.yml").is_file():
            return found
    raise ModakError("the modak.modak collection is not installed where Ansible looks for "
                     "collections (ANSIBLE_COLLECTIONS_PATH): ansible-galaxy collection "
                     "install modak-modak-VERSION.tar.gz")


def _plain(value: Any) -> Any:
    """A model's JSON dump without empty values (a TOSCA datatype's defaults stay its own)."""
    if isinstance(value, dict):
        out = {k: _plain(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def entry_blueprint(request: JobRequest) -> dict[str, Any]:
    """The CSAR's entry: ``request`` as a blueprint of literal values (what the request's
    models hold in another form than the TOSCA types', written back in theirs: a wall time
    in seconds as D-HH:MM:SS, the mail events as one string)."""
    from .readers.common import load_document
    from .readers.tosca import TARGET_TYPE, installed_types
    from .validate import slurm_walltime

    # (the properties of MODAK's target type: the Target model has more, its name)
    properties = load_document(installed_types())["node_types"][TARGET_TYPE]["properties"]
    target = request.target.model_dump(mode="json", exclude_defaults=True)
    target = _plain({k: v for k, v in target.items() if k in properties})
    options = request.job.model_dump(mode="json", exclude_defaults=True)
    if options.get("wall_time_limit") is not None:  # (TOSCA's is a string: D-HH:MM:SS)
        options["wall_time_limit"] = slurm_walltime(options["wall_time_limit"])
    if options.get("mail_events"):
        options["mail_events"] = ",".join(options["mail_events"])
    job = _plain({
        "application": request.application.model_dump(mode="json", exclude_defaults=True),
        "job_options": options,
        "optimisation": request.optimisation.model_dump(mode="json", exclude_defaults=True),
        "environment": dict(request.environment)})
    tname, jname = request.target.name, request.job.job_name
    if jname == tname:
        jname = f"{jname}-job"
    return {
        "tosca_definitions_version": "tosca_simple_yaml_1_3",
        "description": f"{Path(request.source).name} as MODAK {__version__} read it "
                       "(modak opera): every value literal",
        "imports": ["modak-types.yaml"],
        "topology_template": {
            "node_templates": {
                tname: {"type": "modak.nodes.HPCTarget", "properties": target},
                jname: {"type": "modak.nodes.AITrainingJob", "properties": job,
                        "requirements": [{"host": tname}]}},
            "outputs": {name: {"value": {"get_attribute": [jname, attr]}}
                        for name, attr in OUTPUTS.items()}}}


def same_request(request: JobRequest, written: JobRequest) -> None:
    """The entry, read back as the operations will read it, is the request: else an
    internal error naming what differs."""
    keep = {"source", "source_format"}
    a = request.model_dump(mode="json", exclude=keep)
    b = written.model_dump(mode="json", exclude=keep)
    differ = sorted(f"{part}.{k}" for part in a for k in set(a[part]) | set(b[part])
                    if isinstance(a[part], dict) and a[part].get(k) != b[part].get(k))
    if differ:
        from .errors import CatalogueError
        raise CatalogueError(f"the CSAR's entry for {request.source} does not read back as "
                             f"the request: {', '.join(differ)} differ")


def write_csar(request: JobRequest, entry_doc: dict[str, Any],
               files: list[tuple[str, str]], where: Path, playbooks: Path) -> Path:
    """The CSAR folder ``where/csar`` (made anew), with ``entry_doc`` (``entry_blueprint``
    of ``request``) as its entry, and its zip ``where/modak.csar``."""
    from .readers import read_request
    from .readers.tosca import installed_types

    csar = where / "csar"
    if csar.exists():
        shutil.rmtree(csar)
    (csar / "TOSCA-Metadata").mkdir(parents=True)
    for src, dest in files:
        target = csar / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
    shutil.copyfile(installed_types(), csar / "modak-types.yaml")
    shutil.copytree(playbooks, csar / "playbooks",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    entry = "modak-request.yaml"
    (csar / entry).write_text(yaml.safe_dump(entry_doc, sort_keys=False), encoding="utf-8")
    same_request(request, read_request(csar / entry))
    (csar / "TOSCA-Metadata" / "TOSCA.meta").write_text(
        "TOSCA-Meta-File-Version: 1.1\nCSAR-Version: 1.1\n"
        f"Created-By: MODAK {__version__} (modak opera)\nEntry-Definitions: {entry}\n",
        encoding="utf-8")
    archive = where / "modak.csar"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(csar.rglob("*")):
            if path.is_file():
                z.write(path, path.relative_to(csar).as_posix())
    return archive


def _deployed(state: Path) -> bool:
    try:
        return state.is_dir() and any(state.iterdir())
    except OSError:
        return False


def run(action: str, request_file: Path, infra: Optional[Path] = None,
        inputs: Optional[dict[str, Any]] = None, new_run: bool = False,
        extra: tuple[str, ...] = (), clean: bool = False) -> int:
    """``opera ACTION`` for ``request_file``; its exit status.  A deploy of a request file
    deployed before resumes its deployment (one that failed or was interrupted continues,
    one that finished is found as it ended), if the request is the same; another request
    of that file, or a new run, only with ``clean`` (xOpera forgets the earlier
    deployment, whose run stays on the front-end)."""
    opera = shutil.which("opera")
    if opera is None:
        raise ModakError(f"xOpera is not installed here (no opera on PATH): {INSTALL_OPERA}")
    where = instance_dir(request_file)
    state = where / "state"
    args: list[str] = [opera, action, "--instance-path", str(state), *extra]
    if action in ("validate", "deploy"):
        from .readers import read_request
        from .readers.appfiles import application_files, files_digest

        request = read_request(request_file, infra=infra, inputs=inputs or {})
        files = application_files(request)
        playbooks = collection_playbooks()
        entry = entry_blueprint(request)
        digest = hashlib.sha256(yaml.safe_dump(entry).encode()
                                + files_digest(files).encode()).hexdigest()
        mark = where / "deployed.sha256"
        if action == "deploy" and _deployed(state):
            same = mark.is_file() and mark.read_text().strip() == digest and not new_run
            if not same and not clean:
                why = "a new run" if new_run else "another request (it or its files changed)"
                raise ModakError(f"{request_file}: deployed with modak opera before, and this "
                                 f"is {why}: `modak opera undeploy {request_file}` first, or "
                                 "deploy with --clean (xOpera forgets the earlier deployment; "
                                 "its run stays on the front-end)")
            args.insert(2, "--clean-state" if clean else "--resume")
            args.insert(3, "--force")
        where.mkdir(parents=True, exist_ok=True)
        args.append(str(write_csar(request, entry, files, where, playbooks)))
        if action == "deploy":
            mark.write_text(digest + "\n")
    elif not _deployed(state):
        raise ModakError(f"{request_file}: not deployed with modak opera (no state in {where})")
    reason = where / "failed.txt"  # (an operation that fails writes why: job-vars.yml)
    reason.unlink(missing_ok=True)
    env = dict(os.environ, MODAK_CSAR_ROOT=str(where / "csar"), MODAK_OPERA_REASON=str(reason))
    env.setdefault("PYTHONWARNINGS", "ignore::UserWarning")
    if new_run:
        env["MODAK_NEW_RUN"] = "1"
    state.mkdir(parents=True, exist_ok=True)
    if action == "outputs":  # (before the job has ended xOpera raises on its attributes)
        proc = subprocess.run(args, cwd=where, env=env, check=False, capture_output=True,
                              text=True)
        if proc.returncode and "Cannot use an unset value" in proc.stderr:
            raise ModakError(f"{request_file}: no outputs yet: its deployment has not "
                             "finished (modak opera deploy it again to resume it)")
        sys.stdout.write(proc.stdout)
        sys.stderr.write(proc.stderr)
        return proc.returncode
    code = subprocess.run(args, cwd=where, env=env, check=False).returncode
    if code and reason.is_file():
        said = reason.read_text(encoding="utf-8", errors="replace").strip()
        print(f"modak: error: {request_file}: the {said}", file=sys.stderr)
    return code
