"""Kubernetes manifests: both kustomizations render with ``kubectl kustomize``, every core object validates
offline against the Kubernetes schemas (strict), the PyTorchJob against a schema of the fields we use; the
objects agree with each other, and the container command, run with a pod's variables, is the training
command with the pod's rank."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra.core.global_hydra import GlobalHydra

from nerf_lightning.run.config import compose_train_config

from .conftest import REPO_ROOT, clean_env

KUBECTL = shutil.which("kubectl")
K8S = REPO_ROOT / "deploy" / "k8s"
KUBE_VERSIONS = ("1.27.0", "1.33.0")  # an older and a recent API server
SCHEMA = Path(__file__).parent / "schemas" / "pytorchjob-kubeflow-v1.json"

pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not installed: cannot render kustomizations"
)


def render(path: Path) -> dict[str, dict[str, Any]]:
    out = subprocess.run(
        [KUBECTL, "kustomize", str(path)], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    return {doc["kind"]: doc for doc in yaml.safe_load_all(out) if doc}


def validate_core(doc: dict[str, Any]) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")
    for version in KUBE_VERSIONS:
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as err:
            raise AssertionError(
                f"{doc['kind']} {doc['metadata'].get('name')} (k8s {version}): {err}"
            ) from err


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def run_container_command(container: dict[str, Any], tmp_path: Path, env: dict[str, str]) -> list[str]:
    """Run the container's command with a fake ``torchrun`` that records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp_path / "torchrun.args"
    (bin_dir / "torchrun").write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" > {record}\n')
    (bin_dir / "torchrun").chmod(0o755)
    full = clean_env(**env)
    full["PATH"] = f"{bin_dir}{os.pathsep}{full['PATH']}"
    subprocess.run([*container["command"], *container["args"]], env=full, check=True, timeout=30)
    return record.read_text().split("\0")[:-1]


def config_env(container: dict[str, Any], configmap: dict[str, Any]) -> dict[str, str]:
    """The variables the container gets from the ConfigMap (by the generated, hashed name)."""
    env = {}
    for var in container["env"]:
        ref = var.get("valueFrom", {}).get("configMapKeyRef")
        if ref:
            assert ref["name"] == configmap["metadata"]["name"], (
                "ConfigMap reference not rewritten by kustomize"
            )
            env[var["name"]] = configmap["data"][ref["key"]]
        elif "value" in var:
            env[var["name"]] = var["value"]
    return env


def assert_training_overrides_compose(argv: list[str], tmp_path: Path) -> None:
    i = argv.index("nerf_lightning.train")
    assert argv[i - 1] == "-m"
    try:
        cfg = compose_train_config(argv[i + 1 :], tmp_path)
    finally:
        GlobalHydra.instance().clear()
    assert cfg.trainer.strategy._target_.endswith("DDPStrategy")


def shared_volume_ok(pod_spec: dict[str, Any], pvc: dict[str, Any]) -> None:
    claims = [
        v["persistentVolumeClaim"]["claimName"] for v in pod_spec["volumes"] if "persistentVolumeClaim" in v
    ]
    assert claims == [pvc["metadata"]["name"]]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]  # every node mounts it
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in pod_spec["volumes"])  # /dev/shm


def test_statefulset_base(tmp_path: Path) -> None:
    objs = render(K8S / "base")
    assert set(objs) == {
        "ConfigMap",
        "Service",
        "PersistentVolumeClaim",
        "StatefulSet",
        "PodDisruptionBudget",
    }
    for doc in objs.values():
        validate_core(doc)
    sts, svc, pdb, cm, pvc = (
        objs[k]
        for k in ("StatefulSet", "Service", "PodDisruptionBudget", "ConfigMap", "PersistentVolumeClaim")
    )
    pod = sts["spec"]["template"]
    labels = pod["metadata"]["labels"]
    # headless service that names the pods, a budget that covers them
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    for selector in (
        sts["spec"]["selector"]["matchLabels"],
        svc["spec"]["selector"],
        pdb["spec"]["selector"]["matchLabels"],
    ):
        assert labels_match(selector, labels), (selector, labels)
    assert pdb["spec"]["maxUnavailable"] == 0
    shared_volume_ok(pod["spec"], pvc)

    (container,) = pod["spec"]["containers"]
    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == gpus
    env = config_env(container, cm)
    assert int(env["NNODES"]) == sts["spec"]["replicas"] and int(env["GPUS_PER_POD"]) == gpus

    # pod <sts>-1: node rank 1 from its ordinal, pod 0 of the headless service as the main address
    argv = run_container_command(container, tmp_path, {**env, "HOSTNAME": f"{sts['metadata']['name']}-1"})
    main = f"{sts['metadata']['name']}-0.{svc['metadata']['name']}"
    for flag in (
        "--node-rank=1",
        f"--nnodes={sts['spec']['replicas']}",
        f"--nproc-per-node={gpus}",
        f"--master-addr={main}",
        "--master-port=29500",
    ):
        assert flag in argv, (flag, argv)
    assert 29500 in [p["port"] for p in svc["spec"]["ports"]]
    assert argv[argv.index("nerf_lightning.train") + 1 :][:3] == [
        "strategy=ddp",
        f"num_nodes={sts['spec']['replicas']}",
        f"devices={gpus}",
    ]
    assert argv[-len(shlex.split(env["TRAIN_ARGS"])) :] == shlex.split(env["TRAIN_ARGS"])
    assert env["NERF_LIGHTNING_RUN_ID"]  # every pod names the same run directory
    assert_training_overrides_compose(argv, tmp_path)


def test_pytorchjob_overlay(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    objs = render(K8S / "overlays" / "pytorchjob")
    assert set(objs) == {"ConfigMap", "PersistentVolumeClaim", "PodDisruptionBudget", "PyTorchJob"}
    job, pdb, cm, pvc = (
        objs[k] for k in ("PyTorchJob", "PodDisruptionBudget", "ConfigMap", "PersistentVolumeClaim")
    )
    for kind in ("ConfigMap", "PersistentVolumeClaim", "PodDisruptionBudget"):
        validate_core(objs[kind])
    jsonschema.validate(job, json.loads(SCHEMA.read_text()))
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert set(specs) == {"Master", "Worker"}
    nproc = int(job["spec"]["nprocPerNode"])
    for rtype, spec in specs.items():
        template = spec["template"]
        validate_core(
            {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": rtype.lower()},
                "template": template,
            }
        )
        assert labels_match(pdb["spec"]["selector"]["matchLabels"], template["metadata"]["labels"])
        shared_volume_ok(template["spec"], pvc)
        (container,) = template["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == nproc
        assert "registry" in container["image"] or "/" in container["image"]  # the images setting reached it
        env = config_env(container, cm)
        # what the operator sets for Worker 0 (node rank 1) of a 2-node job
        operator_env = {
            "MASTER_ADDR": f"{job['metadata']['name']}-master-0",
            "MASTER_PORT": "23456",
            "PET_NNODES": "2",
            "PET_NPROC_PER_NODE": str(nproc),
            "PET_NODE_RANK": "1",
        }
        argv = run_container_command(container, tmp_path, {**env, **operator_env})
        assert f"--master-addr={operator_env['MASTER_ADDR']}" in argv and "--master-port=23456" in argv
        assert argv[argv.index("nerf_lightning.train") + 1 :][:3] == [
            "strategy=ddp",
            "num_nodes=2",
            f"devices={nproc}",
        ]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["pytorchjob-port"] == 23456
        name_ref = next(v for v in container["env"] if v["name"] == "NERF_LIGHTNING_RUN_ID")
        assert "training.kubeflow.org/job-name" in name_ref["valueFrom"]["fieldRef"]["fieldPath"]
        assert_training_overrides_compose(argv, tmp_path)

    broken = json.loads(json.dumps(job))
    broken["spec"]["pytorchReplicaSpecs"]["Worker"]["replica"] = 2  # misspelt: the schema is strict
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, json.loads(SCHEMA.read_text()))
