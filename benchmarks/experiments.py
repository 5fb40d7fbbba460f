"""The named experiments of the benchmark runner: every number in BENCHMARKS.md names one of these.

    python -m benchmarks.suite --list          # names, jobs, expected seconds, data
    python -m benchmarks.suite NAME --dry-run  # the exact command lines

Times are sized for one H200: an experiment fits a 10-minute machine slot unless its summary says
otherwise, and ``--limit`` skips what would not end in time. Captures come from ``--data``: ``lego``
(NeRF-synthetic, Blender format), ``fox`` (instant-ngp's) and ``fruit`` (a phone capture).

**Adding an experiment** is one :func:`add` below, built from :mod:`benchmarks.jobs`:
``ab(scene, {variant: overrides}, seeds, steps)`` for a quality A/B at fixed steps (each variant paired
with ``default`` at its seed; wrap it in ``in_lanes`` when the jobs may share the GPU), ``train`` for one
run, ``curve`` for held-out PSNR after fixed seconds of training, and ``pytest``, ``module`` or ``command``
for anything else, with a reader from :mod:`benchmarks.readers` (``jsonl(...)`` reads a
JSON-lines results file, e.g. another implementation's driver run side by side). Give a job a
``baseline`` of the same experiment whenever a ratio is the number to report.
"""

from __future__ import annotations

from importlib.util import find_spec

from benchmarks import readers
from benchmarks.batch_rules import overrides as imitate
from benchmarks.jobs import (
    QUIET,
    SCENES,
    Experiment,
    Job,
    ab,
    command,
    cost,
    curve,
    in_lanes,
    module,
    peers,
    pytest,
    train,
)

EXPERIMENTS: dict[str, Experiment] = {}


def add(name: str, summary: str, *jobs: Job, data: tuple[str, ...] = ()) -> None:
    """Register an experiment (names are unique)."""
    if name in EXPERIMENTS:
        raise ValueError(f"experiment {name} is defined twice")
    EXPERIMENTS[name] = Experiment(name, summary, tuple(jobs), data)


FRUIT_SEEDS = (42, 5, 6, 8, 1, 2, 3)
SEEDS = (1, 2, 3)
DEFAULT: dict[str, tuple[str, ...]] = {"default": ()}

# --------------------------------------------------------------------------------------- variants
INGP_PIXELS = ("data.pixel_jitter=true",)  # instant-ngp's pixels: random points inside them
NO_GS = ("model.net.renderer.gradient_scaling_distance=null",)
NO_NEAR = ("model.net.renderer.near_plane=0.0",)
_LW = "data.samplers.loss_weighted"
LW = ("data.sampler=loss_weighted",)
LW_STRONG = (*LW, f"{_LW}.alpha=2.0", f"{_LW}.uniform_floor=0.1")
LW_WEAK = (*LW, f"{_LW}.alpha=0.5", f"{_LW}.uniform_floor=0.5")
SAMPLERS = {**DEFAULT, "lw": LW}
_ENC = "model.net.field.encoding"
TABLE = {f"t{n}": (f"{_ENC}.log2_hashmap_size={n}",) for n in (19, 20, 21, 24)}
LEVELS_8 = (f"{_ENC}.n_levels=8",)
LAYOUTS = {
    **DEFAULT,
    "8x4": (f"{_ENC}.n_levels=8", f"{_ENC}.n_features_per_level=4"),
    "6x8": (f"{_ENC}.n_levels=6", f"{_ENC}.n_features_per_level=8"),
}
#: candidates for the background of real captures (fruit's garbled wall, blurred bed, floaters)
PHOTO_BACKGROUND = {**DEFAULT, "t21": TABLE["t21"], "dist_0.001": ("model.net.loss.distortion_weight=0.001",)}
# 1/512: 2x far samples
FAR_CONE = {**DEFAULT, "cone_512": ("model.net.renderer.large_scene_cone_angle=0.001953125",)}
POSES = ("model.net.camera_opt.enabled=true",)
EXPOSURE = ("model.net.appearance.enabled=true",)
VIEWS = {**DEFAULT, "poses": POSES, "exposure": EXPOSURE, "both": (*POSES, *EXPOSURE)}
VIEW_SEEDS = {"fox": SEEDS, "fruit": (42, 5, 6)}
PRECISIONS = {"p32": ("precision=32",), "bf16": ("precision=bf16-mixed",), "fp16": ("precision=16-mixed",)}
TWO_GPUS = {"NCCL_NVLS_ENABLE": "0"}  # NVLink multicast stays off on the GPU machines
GPU_0 = {"CUDA_VISIBLE_DEVICES": "0"}

#: The CPU test's tiny run (seconds on 2 cores): small grid, coarse marching, a 24x24 scene.
TINY = (
    "accelerator=cpu", "experiment=cpu", "data.path={exp_dir}/scene", "data.batch_size=128",
    "data.steps_per_epoch=8", "model.net.renderer.occupancy.resolution=16",
    "model.net.renderer.occupancy.warmup_steps=4",
    "model.net.renderer.occupancy.update_every=4", f"{_ENC}.n_levels=4", f"{_ENC}.log2_hashmap_size=12",
    f"{_ENC}.max_resolution=64", "model.net.renderer.max_samples_per_ray=32",
    "model.net.renderer.step_size=0.054",
    "model.save_val_images=false",
)  # fmt: skip
#: ``make test-repro``'s recipe on the generated fruit-like capture: ``benchmarks.capture_ab.CPU_REPRO``
#: without the downscale (the generated views have the real capture's 1/16 size).
GENERATED_RECIPE = (
    "accelerator=cpu data.batch_size=512 model.net.step.sample_budget=null model.net.backend=torch "
    "model.net.renderer.occupancy.resolution=32 model.net.renderer.step_size=0.03 "
    "model.net.renderer.large_scene_cone_angle=0.0625 model.net.renderer.max_samples_per_ray=64"
)


Block = tuple[str, dict[str, tuple[str, ...]], tuple[int, ...], int]  # scene, variants, seeds, steps


def lanes_ab(blocks: list[Block], **job: object) -> tuple[Job, ...]:
    """Several :func:`~benchmarks.jobs.ab` blocks, spread over three lanes."""
    return in_lanes([j for scene, var, seeds, steps in blocks for j in ab(scene, var, seeds, steps, **job)])


# The batch rule for several GPUs, measured on one GPU: benchmarks/batch_rule.py turns the rows of
# A (step_scaling) and B (rule_run) into the predicted time to quality on 2, 4 and 8 GPUs.
def step_scaling(scene: str, scales: str = "") -> Job:
    """A: the graphed step alone at B, B/2, B/4, B/8 (``scales``: other fractions of the batch, as
    ``--scales``), the gradient's bytes and touched rows, and the GPU time of a rank's share of the
    occupancy update and of Adam."""
    chosen = ("--scales", scales) if scales else ()
    return module(
        f"step_{scene}", "benchmarks.step_scaling", *chosen, "--json",
        "{run_dir}/step_scaling.json", "--", *SCENES[scene], read=readers.step_scaling_json(scene),
        expected_s=45, timeout_s=240,
    )  # fmt: skip


#: reference steps of the quality runs, and between their validations (held out, every view)
RULE_STEPS = {"lego": 20000, "fox": 10000}
_VAL_EVERY = 1000
_VAL_S = {"lego": 1.5, "fox": 2.5}  # one validation in a lane


def rule_run(
    scene: str, k: int, rule: str, *overrides: str, seed: int = 1, steps: int | None = None, tag: str = ""
) -> Job:
    """B: one GPU drawing k x the batch under ``rule`` (:func:`benchmarks.batch_rules.imitated`):
    trainer.max_steps reference steps (k x fewer optimizer steps under the rules in rays; ``steps``,
    default ``RULE_STEPS[scene]``), validated every 1000 of them; ``tag`` ends the job's name."""
    from benchmarks.batch_rule import TARGETS

    steps = RULE_STEPS[scene] if steps is None else steps
    # per_device counts optimizer steps of k x the batch: k x the GPU time
    in_steps = rule == "per_device"
    expected, timeout = cost(scene, steps * (k if in_steps else 1))
    expected += steps / _VAL_EVERY * _VAL_S[scene]
    return train(
        f"{scene}_k{k}_{rule}{tag}", scene, *imitate(rule, k),
        f"data.steps_per_epoch={_VAL_EVERY}", "trainer.check_val_every_n_epoch=1",
        "model.save_val_images=false", *overrides,
        steps=steps, seed=seed, read=readers.val_curve(scene, TARGETS[scene]), expected_s=expected,
        timeout_s=max(timeout, 2 * expected + 30),
    )  # fmt: skip


def sized(
    k: int, rule: str, lengths: tuple[int, ...], *overrides: str, tag: str = "", seed: int = 1
) -> list[Job]:
    """:func:`rule_run` on lego once per run length (reference steps), named ``..._{tag}_12k`` (seeds
    other than 1: ``..._{tag}_s2_12k``): runs sized to end at the target, whose shortest length reaching
    it ``benchmarks.batch_rule`` reads."""
    tag += "" if seed == 1 else f"_s{seed}"
    return [
        rule_run("lego", k, rule, *overrides, steps=n, seed=seed, tag=f"{tag}_{n // 1000}k") for n in lengths
    ]


def peer_points(scene: str, times: tuple[float, ...]) -> tuple[Job, ...]:
    """:func:`~benchmarks.jobs.peers` once per program and time point, named ``ours_60``,
    ``ngp_300``, ...: a 300 s pair of runs fills most of one call, so ``--only`` picks the points."""
    return tuple(peers(f"{p}_{t:g}", scene, p, (t,)) for p in ("ours", "ngp") for t in times)


# Registrations below are laid out by hand (one experiment per statement); a formatter leaves them.
# fmt: off
# ------------------------------------------------------------------------------------------ checks
add("cpu-smoke", "two tiny CPU runs in lanes on a generated 24x24 scene (seconds; the runner's own test)",
    module("scene", "nerf_lightning.data.synthetic", "{run_dir}", "--views", "8", "--width", "24",
           "--height", "24", "--supersample", "1", "--overwrite", gpus=0, expected_s=10, timeout_s=120),
    *in_lanes([
        train("tiny", "default", *TINY, steps=8, seed=1, gpus=0, expected_s=20, timeout_s=180),
        train("tiny_t10", "default", *TINY, f"{_ENC}.log2_hashmap_size=10", steps=8, seed=1,
              baseline="tiny", gpus=0, expected_s=20, timeout_s=180),
    ], 2))
#: the viewer's tests import viser and websockets (core dependencies, which a GPU machine given only the
#: carried wheels may lack): there they are left out by name instead of failing the collection
VIEWER_TESTS = () if find_spec("viser") and find_spec("websockets") else (
    "--ignore=tests/viewer", "--ignore=tests/benchmarks/test_viewer_bench.py")
add("cuda-tests", "the GPU tests: every CUDA kernel against the PyTorch reference (the viewer's only where "
    "viser is installed)",
    pytest("cuda_tests", "-m", "cuda", "tests", *VIEWER_TESTS, expected_s=45, timeout_s=300))

# --------------------------------------------------------------------------------- time to quality
add("lego-curve", "lego: held-out PSNR after 15, 60 and 300 s of training, alone on the GPU (~8 min)",
    curve("curve", "lego", (15, 60, 300), 330), data=("lego",))
add("hash-table-300s", "lego's 300 s point, 2^20 table against 2^19 (~11 min: one job per slot, --only)",
    curve("t19", "lego", (300,), 360), curve("t20", "lego", (300,), 300, *TABLE["t20"], baseline="t19"),
    data=("lego",))
add("peers-fox", "fox beside instant-ngp (its driver, JIT on) at 15 and 60 s, each alone on the GPU, on "
    "the same views: both metrics, per view; instant-ngp with train extrinsics at 60 s (carry .peers)",
    peers("ngp", "fox", "ngp", (15, 60)),
    peers("ngp_extrinsics", "fox", "ngp", (60,), "--ngp-train-extrinsics"),
    peers("ours", "fox", "ours", (15, 60)), data=("fox",))
add("peers-fruit", "fruit beside instant-ngp at 15 and 60 s; its Blender-layout copy at 60 s with `auto` "
    "(the photo recipe) (carry .peers)",
    peers("ngp", "fruit", "ngp", (15, 60)), peers("ours", "fruit", "ours", (15, 60)),
    peers("ours_blender", "fruit", "ours", (60,), "--layout", "blender"), data=("fruit",))
add("peers-lego", "lego beside instant-ngp at 15 and 60 s, each alone on the GPU, on the same views "
    "(carry .peers)",
    peers("ngp", "lego", "ngp", (15, 60)), peers("ours", "lego", "ours", (15, 60)), data=("lego",))
for _scene in ("lego", "fox", "fruit"):
    add(f"peers-{_scene}-curve", f"{_scene} beside instant-ngp at 15, 60 and 300 s, one job per program and "
        "point, each alone on the GPU (~17 min in all: pick points with --only; carry .peers)",
        *peer_points(_scene, (15, 60, 300)), data=(_scene,))
add("default-scene", "`make train` on a GPU: the generated default scene, 20k steps",
    train("default", "default", "logger=csv", "callbacks.progress_bar=null", quiet=False,
          expected_s=150, timeout_s=420))

# ------------------------------------------------------------------ quality at fixed steps (lanes)
add("lego-20k", "lego 20k steps, seeds 1-3: the default (pixel centres) against instant-ngp's jitter",
    *lanes_ab([("lego", {**DEFAULT, "ingp_pixels": INGP_PIXELS}, SEEDS, 20000)]), data=("lego",))
add("lego-recipe", "lego 20k steps, seed 1: jittered pixels, a finest level of 4096",
    *lanes_ab([("lego", {**DEFAULT, "jitter": ("data.pixel_jitter=true",),
                         "res4096": (f"{_ENC}.max_resolution=4096",)}, (1,), 20000)]), data=("lego",))
add("fox-5k", "fox 5k steps, seeds 1-3: the default (jitter) against pixel centres",
    *lanes_ab([("fox", {**DEFAULT, "centres": ("data.pixel_jitter=false",)}, SEEDS, 5000)]), data=("fox",))
add("fox-20k", "fox 20k steps (the default run), seeds 1-3, against no near-camera gradient scaling",
    *lanes_ab([("fox", {**DEFAULT, "no_gs": NO_GS}, SEEDS, 20000)]), data=("fox",))
add("fruit-2k-seeds", "the fruit phone capture, 2000 steps, 7 seeds, against no near-camera gradient scaling",
    *lanes_ab([("fruit", {**DEFAULT, "no_gs": NO_GS}, FRUIT_SEEDS, 2000)]), data=("fruit",))
add("gradient-scaling", "lego and fox 5k steps, seeds 1-3: near-camera gradient scaling on / off",
    *lanes_ab([("lego", {**DEFAULT, "no_gs": NO_GS}, SEEDS, 5000),
               ("fox", {**DEFAULT, "no_gs": NO_GS}, SEEDS, 5000)]), data=("lego", "fox"))
add("near-plane", "near plane 0.2 (default) against 0: fruit 2000 steps at 7 seeds, lego and fox 5k seed 1",
    *lanes_ab([("fruit", {**DEFAULT, "near_0": NO_NEAR}, FRUIT_SEEDS, 2000),
               ("lego", {**DEFAULT, "near_0": NO_NEAR}, (1,), 5000),
               ("fox", {**DEFAULT, "near_0": NO_NEAR}, (1,), 5000)]), data=("lego", "fox", "fruit"))

# ------------------------------------------------------------------------- options that stay off
add("photo-background", "fox and fruit 5k steps, seeds 1-3: a 2^21 table and the distortion loss at 1e-3 "
    "against the default (the background of real captures)",
    *lanes_ab([("fox", PHOTO_BACKGROUND, SEEDS, 5000), ("fruit", PHOTO_BACKGROUND, SEEDS, 5000)]),
    data=("fox", "fruit"))
add("photo-far-cone", "fox and fruit 5k steps, seeds 1-3: a cone angle of 1/512 (twice the far-field "
    "samples) against the default",
    *lanes_ab([("fox", FAR_CONE, SEEDS, 5000), ("fruit", FAR_CONE, SEEDS, 5000)]), data=("fox", "fruit"))
add("sampler-ab", "lego and fox 5k steps, seeds 1-3: uniform (default) against loss-weighted",
    *lanes_ab([("lego", SAMPLERS, SEEDS, 5000), ("fox", SAMPLERS, SEEDS, 5000)]), data=("lego", "fox"))
add("sampler-strength", "lego and fox 5k steps, seeds 1-3: loss-weighted alpha 2 / floor 0.1 (fox 0.5 / 0.5)",
    *lanes_ab([("lego", {**DEFAULT, "lw_2_0.1": LW_STRONG}, SEEDS, 5000),
               ("fox", {**DEFAULT, "lw_2_0.1": LW_STRONG, "lw_0.5_0.5": LW_WEAK}, SEEDS, 5000)]),
    data=("lego", "fox"))
add("hash-table", "lego 20k steps: hash tables of 2^19 (default) and 2^20 at seeds 1-3, 2^21 at seed 1",
    *in_lanes([*ab("lego", {"t19": (), "t20": TABLE["t20"]}, SEEDS, 20000, baseline="t19"),
               *ab("lego", {"t21": TABLE["t21"]}, (1,), 20000, baseline="t19")]), data=("lego",))
add("hash-table-fox", "fox 5k steps, seeds 1-3: hash tables of 2^19 (default) and 2^20",
    *in_lanes(ab("fox", {"t19": (), "t20": TABLE["t20"]}, SEEDS, 5000, baseline="t19")), data=("fox",))
add("hash-levels", "8 hash levels against 16: lego and fox 5k steps, fruit 2000 steps, seeds 1-3",
    *lanes_ab([(s, {**DEFAULT, "levels_8": LEVELS_8}, SEEDS, 2000 if s == "fruit" else 5000)
               for s in ("lego", "fox", "fruit")]), data=("lego", "fox", "fruit"))
add("hash-layout", "hash grids of one size: 16x2 (default), 8x4, 6x8 levels x features; lego, fruit",
    *lanes_ab([("lego", LAYOUTS, (1,), 5000), ("fruit", LAYOUTS, (42,), 2000)]), data=("lego", "fruit"))
add("distortion", "mip-NeRF 360's distortion loss (weights 0.01, 0.001) on fruit, seeds 8 and 6",
    *lanes_ab([("fruit", {**DEFAULT, "dist_0.01": ("model.net.loss.distortion_weight=0.01",),
                          "dist_0.001": ("model.net.loss.distortion_weight=0.001",)}, (8, 6), 2000)]),
    data=("fruit",))
add("sample-budget", "lego 20k steps alone: 2^18 samples per step (default) against a fixed 8192 rays",
    train("budget", "lego", steps=20000, seed=1, shared=False),
    train("rays_8192", "lego", "model.net.step.sample_budget=null", "data.batch_size=8192", steps=20000,
          seed=1, baseline="budget", expected_s=240, timeout_s=420), data=("lego",))

add("views-5k", "learned camera poses / exposure / both against neither: fox and fruit 5k steps, 3 seeds "
    "(~10 min)",
    *lanes_ab([(scene, VIEWS, VIEW_SEEDS[scene], 5000) for scene in ("fox", "fruit")]), data=("fox", "fruit"))
add("views-20k-fox", "learned poses and exposure (both) against neither: fox 20k steps, seeds 1-3 (~7 min)",
    *lanes_ab([("fox", {**DEFAULT, "both": VIEWS["both"]}, SEEDS, 20000)]), data=("fox",))
add("views-20k-fruit", "learned poses and exposure (both) against neither: fruit 20k steps, seeds 42, 5, 6 "
    "(~8 min)",
    *lanes_ab([("fruit", {**DEFAULT, "both": VIEWS["both"]}, VIEW_SEEDS["fruit"], 20000)]), data=("fruit",))

# ------------------------------------------------------------------------------------------ speed
add("views-speed", "steps/s alone, 3000 steps: lego and fox by default (both off), fox with learned poses, "
    "exposure and both (the ratio to fox's default)",
    train("lego", "lego", steps=3000, seed=1, shared=False),
    train("fox", "fox", steps=3000, seed=1, shared=False),
    *[train(f"fox_{v}", "fox", *VIEWS[v], steps=3000, seed=1, shared=False, baseline="fox")
      for v in ("poses", "exposure", "both")], data=("lego", "fox"))

add("precision", "lego and fox 5k steps alone: 32 (the baseline), bf16-mixed, 16-mixed; lego bf16 with "
    "torch MLPs",
    *ab("lego", {**PRECISIONS, "bf16_torch_mlp": ("precision=bf16-mixed", "model.net.backend=torch")},
        (1,), 5000, baseline="p32", shared=False),
    *ab("fox", PRECISIONS, (1,), 5000, baseline="p32", shared=False), data=("lego", "fox"))
add("step-census", "the graphed lego step outside Lightning per precision: wall, GPU span, kernels",
    *[module(f"census_{p}", "benchmarks.census", "--precision", p, "--path", "{data}/lego",
             "--json", "{run_dir}/census.json", read=readers.census_json, expected_s=45, timeout_s=180,
             baseline=None if p == "32-true" else "census_32-true")
      for p in ("32-true", "bf16-mixed", "16-mixed")], data=("lego",))
#: benchmarks/loop_profile.LoopProfile from optimizer step 1000: 500 steps timed, 500 under cProfile
LOOP_WINDOW = ("+callbacks.loop_profile._target_=benchmarks.loop_profile.LoopProfile",
               "+callbacks.loop_profile.start=1000", "+callbacks.loop_profile.steps=500")
#: and then 100 under torch.profiler, with the synchronizing calls located
LOOP_PROFILE = (*LOOP_WINDOW, "+callbacks.loop_profile.kernel_steps=100")
#: the callbacks of conf/callbacks/default.yaml that QUIET keeps, off (the app's own stay: divergence, ...)
NO_CALLBACKS = tuple(f"callbacks.{name}=null" for name in (
    "throughput", "prometheus", "sampler_monitor", "lr_monitor", "load_balance"))
add("loop-profile", "where the Lightning loop's host time goes (its step against the bare step of "
    "batch-rule-step): lego 2500 steps alone with benchmarks.loop_profile's window, with the default "
    "callbacks and without those of the callbacks group (no progress bar), then as a user runs it (the "
    "progress bar and the checkpoint callbacks on, no validation before the end); then 100 steps under "
    "torch.profiler with the synchronizing calls located",
    train("loop_lego", "lego", *LOOP_PROFILE, steps=2500, shared=False, read=readers.loop_profile_json),
    train("loop_lego_no_callbacks", "lego", *NO_CALLBACKS, *LOOP_PROFILE, steps=2500, shared=False,
          read=readers.loop_profile_json, baseline="loop_lego", ratio_of="loop_steps_per_s"),
    train("loop_lego_as_users", "lego", "logger=csv", "trainer.check_val_every_n_epoch=100000", *LOOP_PROFILE,
          steps=2500, quiet=False, shared=False, read=readers.loop_profile_json, baseline="loop_lego",
          ratio_of="loop_steps_per_s"),
    data=("lego",))
add("host-loop", "whether the loop is bound by its host (issue 64): lego 2500 steps with the step stubbed "
    "(benchmarks.host_loop: the batch, Adam, the grid, the callbacks and Lightning, no rendering), the real "
    "loop in the same window, and the graphed step alone (benchmarks.census, bf16-mixed); one after "
    "the other, each alone on the GPU",
    module("host_loop_lego", "benchmarks.host_loop", "--start", "1000", "--steps", "500", "--", *QUIET,
           *SCENES["lego"], "trainer.max_steps=2500", "hydra.run.dir={run_dir}",
           read=readers.loop_profile_json, expected_s=60, timeout_s=240),
    train("loop_lego_real", "lego", *LOOP_WINDOW, steps=2500, shared=False, read=readers.loop_profile_json,
          baseline="host_loop_lego", ratio_of="loop_steps_per_s"),
    module("census_bf16", "benchmarks.census", "--precision", "bf16-mixed", "--path", "{data}/lego",
           "--json", "{run_dir}/census.json", read=readers.census_json, expected_s=45, timeout_s=180),
    data=("lego",))
add("update-graph", "the optimizer's update in the step's CUDA graph (model.graph_optimizer=auto) against "
    "Lightning's automatic optimization with the update eager (false), issue 64: lego 2500 steps alone, the "
    "loop's ms a step over steps 1000-1500; then the stubbed loop (benchmarks.host_loop) of each, the host's "
    "share",
    *[train(f"loop_{name}_update", "lego", f"model.graph_optimizer={mode}", *LOOP_WINDOW, steps=2500,
            shared=False, read=readers.loop_profile_json,
            **({} if name == "eager" else {"baseline": "loop_eager_update", "ratio_of": "loop_steps_per_s"}))
      for name, mode in (("eager", "false"), ("graph", "auto"))],
    *[module(f"host_loop_{name}_update", "benchmarks.host_loop", "--start", "1000", "--steps", "500", "--",
             *QUIET, *SCENES["lego"], "trainer.max_steps=2500", "hydra.run.dir={run_dir}",
             f"model.graph_optimizer={mode}", read=readers.loop_profile_json, expected_s=60, timeout_s=240)
      for name, mode in (("eager", "false"), ("graph", "auto"))],
    data=("lego",))
add("update-graph-tests", "the GPU tests of the update graph and of the graphed step with poses "
    "and exposures (a part of cuda-tests, for a call too short for all of them)",
    pytest("update_graph_tests", "-m", "cuda", "tests/models/test_update_graph_cuda.py",
           "tests/models/test_view_corrections_cuda.py", expected_s=30, timeout_s=120))
#: issue 64's two candidates against the step's kernels: the table's gradient by a warp per level, the
#: density pass's features reused by the differentiable pass
STEP_KERNELS = {
    "point": ({"NERF_LIGHTNING_HASH_ORDER": "point"}, ()),
    "warp": ({"NERF_LIGHTNING_HASH_ORDER": "warp"}, ()),
    "reuse": ({"NERF_LIGHTNING_HASH_ORDER": "point"}, ("model.net.renderer.reuse_features=true",)),
    "both": ({"NERF_LIGHTNING_HASH_ORDER": "warp"}, ("model.net.renderer.reuse_features=true",)),
}
add("step-kernels", "the table's gradient by one warp per level, runs of equal corners summed before one "
    "atomic (NERF_LIGHTNING_HASH_ORDER=warp), and the density pass's hash features reused by the "
    "differentiable pass (model.net.renderer.reuse_features=true), against the default, issue 64: their "
    "GPU tests, then the "
    "graphed lego step alone (benchmarks.census, bf16-mixed) of the default and each, and the loop's ms a "
    "step with the update in the graph (model.graph_optimizer=auto) of the default and both, each alone",
    pytest("kernel_tests", "-m", "cuda", "tests/models/test_encoding_cuda.py",
           "tests/volume/test_reuse_features.py", expected_s=40, timeout_s=150),
    *[module(f"census_{name}", "benchmarks.census", "--precision", "bf16-mixed", "--path", "{data}/lego",
             "--json", "{run_dir}/census.json", "--", *STEP_KERNELS[name][1], read=readers.census_json,
             expected_s=45, timeout_s=180, env=STEP_KERNELS[name][0],
             **({} if name == "point" else {"baseline": "census_point"}))
      for name in ("point", "warp", "reuse")],
    *[train(f"loop_{name}", "lego", "model.graph_optimizer=auto", *STEP_KERNELS[name][1], *LOOP_WINDOW,
            steps=2500, shared=False, read=readers.loop_profile_json, env=STEP_KERNELS[name][0],
            **({} if name == "point" else {"baseline": "loop_point", "ratio_of": "loop_steps_per_s"}))
      for name in ("point", "both")],
    data=("lego",))
add("loop-profile-ranks", "the Lightning loop at a rank's batch under the rules that split the batch (3/4 "
    "and 1/2 of it, benchmarks.batch_rules.imitated), where the graphed step alone is shorter than the "
    "loop's host work; against batch-rule-step's step alone at the same fractions",
    *[train(f"loop_lego_x{m}", "lego", *imitate("large_batch", float(m)), *LOOP_WINDOW, steps=2500,
            shared=False, read=readers.loop_profile_json) for m in ("0.75", "0.5")],
    data=("lego",))
add("ops", "each CUDA op against the PyTorch reference, measured in the same run (bench.ops)",
    module("ops", "nerf_lightning.bench.ops", "--profile", "--json", "{run_dir}/ops.json",
           read=readers.ops_json, expected_s=120, timeout_s=400))
add("tcnn", "tiny-cuda-nn's hash grid against our kernels: its GPU tests against our reference, then "
    "benchmarks.tcnn (the encoding at 2^18 and 2^20 points, the training step, lego 60 s per backend); needs "
    "the tinycudann wheel of scripts/tcnn/build_wheel.sh in .whl/",
    pytest("tcnn_tests", "-m", "cuda", "-s", "tests/models/test_encoding_tcnn.py", expected_s=40,
           timeout_s=180),
    module("bench", "benchmarks.tcnn", "--lego", "{data}/lego", "--out", "{run_dir}/runs",
           "--json", "{run_dir}/tcnn.json", "--markdown", "{run_dir}/tcnn_table.txt", read=readers.tcnn_json,
           expected_s=330, timeout_s=560), data=("lego",))
add("data-path", "fox at full resolution: data time per step against the training step (benchmarks.data)",
    module("fox", "benchmarks.data", "--path", "{data}/fox", "--downscale", "1",
           "--steps", "100", read=readers.log_lines(r"decode|data ms|train step ms|data /"),
           expected_s=60, timeout_s=240), data=("fox",))
add("apps", "lego 3000 steps with checkpoints, then eval (the same PSNR), an 800x800 orbit video, a "
    "mesh (the GPU machine needs imageio-ffmpeg, trimesh, PyMCubes)",
    train("lego_3k", "lego", "logger=csv", "callbacks.progress_bar=null", steps=3000, quiet=False,
          shared=False),
    module("eval", "nerf_lightning.eval", "ckpt={exp_dir}/lego_3k", "hydra.run.dir={run_dir}",
           read=readers.metrics_json, baseline="lego_3k", expected_s=30, timeout_s=180),
    module("render", "nerf_lightning.render", "ckpt={exp_dir}/lego_3k", "camera_path=orbit", "frames=120",
           "width=800", "height=800", "hydra.run.dir={run_dir}", read=readers.render_json,
           expected_s=40, timeout_s=240),
    module("mesh", "nerf_lightning.export", "mesh", "ckpt={exp_dir}/lego_3k", "resolution=256",
           "hydra.run.dir={run_dir}", expected_s=40, timeout_s=240), data=("lego",))

add("viewer", "the browser viewer, lego 20k steps (~60 s) twice: viewer=off against viewer=on with a client "
    "orbiting an 800x800 canvas (steps/s), then frames/s of its checkpoint at 800x800 and 256x256 (the "
    "preview); the GPU machine needs viser's wheels",
    module("viewer", "benchmarks.viewer", "--sizes", "800,256", "--frames", "30", "--out",
           "{run_dir}", "--", "experiment=blender", "data.path={data}/lego", "logger=csv",
           "callbacks.progress_bar=null", "trainer.max_steps=20000", read=readers.viewer_json,
           expected_s=240, timeout_s=540), data=("lego",))

# ------------------------------------------------------------------------------ several GPUs
_DDP2 = {"gpus": 2, "env": TWO_GPUS, "shared": False, "expected_s": 60.0, "timeout_s": 180.0}
add("ddp-scaling", "2 GPUs, lego and fox 3000 steps: 1 GPU against DDP (Lightning's launcher, torchrun, "
    "the batch split)",
    train("lego_1gpu", "lego", steps=3000, shared=False, env=GPU_0),
    train("lego_ddp2", "lego", "strategy=ddp", "devices=2", steps=3000, baseline="lego_1gpu",
          ratio_of="rays_per_s", **_DDP2),
    command("lego_torchrun2", "{python}", "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node=2", "-m", "nerf_lightning.train", *QUIET, "experiment=blender",
            "data.path={data}/lego", "strategy=ddp", "devices=2", "trainer.max_steps=3000",
            "hydra.run.dir={run_dir}", read=readers.metrics_json, baseline="lego_ddp2", ratio_of="rays_per_s",
            gpus=2, env=TWO_GPUS, expected_s=60, timeout_s=180),
    train("fox_1gpu", "fox", steps=3000, seed=42, shared=False, env=GPU_0),
    train("fox_ddp2", "fox", "strategy=ddp", "devices=2", steps=3000, seed=42, baseline="fox_1gpu",
          ratio_of="rays_per_s", **_DDP2), data=("lego", "fox"))


def timed_run(
    gpus: int, rule: str, exchange: str, length: int, seed: int, *overrides: str, tag: str = ""
) -> Job:
    """Lego in ``length`` reference steps on ``gpus`` real GPUs (DDP above one) under ``rule``, ``exchange``
    and ``overrides`` (named with ``tag``), alone on them and validated once at the end, read by
    ``readers.ddp_run``: its training time and final PSNR, for the prediction's check
    (``benchmarks.batch_rule``'s "Measured" table)."""
    expected, timeout = cost("lego", length // gpus if rule != "per_device" else length, shared=False)
    if gpus == 1:
        return train(
            f"lego_1gpu_s{seed}_{length // 1000}k", "lego", f"batch_rule={rule}", steps=length,
            seed=seed, shared=False, env=GPU_0, read=readers.ddp_run("lego"), expected_s=expected,
            timeout_s=timeout,
        )  # fmt: skip
    return train(
        f"lego_ddp{gpus}_{rule}{tag}_{exchange}_s{seed}_{length // 1000}k", "lego", "strategy=ddp",
        f"devices={gpus}", f"batch_rule={rule}", f"grad_exchange={exchange}", *overrides,
        steps=length, seed=seed, shared=False, gpus=gpus, env=TWO_GPUS, read=readers.ddp_run("lego"),
        expected_s=expected + 20, timeout_s=timeout + 60,
    )  # fmt: skip


def timed_runs(gpus: int, rule: str, lengths: tuple[int, ...], *overrides: str, tag: str = "") -> list[Job]:
    """One GPU in 10k, 12k and 14k reference steps (a seed may end below 36.2 dB at 12k) and ``gpus`` GPUs
    under ``rule`` and ``overrides`` in ``lengths``, each exchange, seeds 1-3 seed by seed (``--only
    '*_s1_*'`` picks a seed)."""
    return [
        job
        for seed in (1, 2, 3)
        for job in (
            *[timed_run(1, "per_device", "fp32", n, seed) for n in (10000, 12000, 14000)],
            *[timed_run(gpus, rule, x, n, seed, *overrides, tag=tag)
              for x in ("fp32", "bf16") for n in lengths],
        )
    ]


add("batch-rule-ddp2", "the batch rule's prediction checked on 2 real GPUs (nvidia-h200-x2): lego to 36.2 dB "
    "under auto (large_batch) with either exchange against one GPU, runs sized to 10k and 12k reference "
    "steps (one GPU: also 14k), seeds 1-3, each alone (~7 min a seed); benchmarks.batch_rule's \"Measured\" "
    "table reads them",
    *timed_runs(2, "auto", (10000, 12000)), data=("lego",))
add("batch-rule-ddp4", "the batch rule's prediction checked on 4 real GPUs (nvidia-h200-x4): lego to 36.2 dB "
    "under the 4-GPU recipe (large_batch, each rank 3/4 of the batch: k = 3; auto is per_device at 4 GPUs) "
    "with either exchange against one GPU, runs sized to 12k and 13k reference steps (one GPU: 10k, 12k, "
    "14k), seeds 1-3, each alone (~6 min a seed)",
    *timed_runs(4, "large_batch", (12000, 13000), *imitate("large_batch", 0.75), tag="_x0.75"),
    data=("lego",))

add("fsdp", "2 GPUs: FSDP per precision (lego 3000 steps), peak memory per GPU with a 2^24 table",
    *[train(f"fsdp_{p}", "lego", "strategy=fsdp", "devices=2", f"precision={p}", steps=3000,
            baseline=None if p == "32" else "fsdp_32", **{**_DDP2, "expected_s": 90.0, "timeout_s": 240.0})
      for p in ("32", "bf16-mixed", "16-mixed")],
    train("mem_1gpu", "lego", *TABLE["t24"], steps=200, shared=False, env=GPU_0),
    *[train(f"mem_{s}2", "lego", f"strategy={s}", "devices=2", *TABLE["t24"], steps=200, baseline="mem_1gpu",
            ratio_of="mem_gb", **_DDP2) for s in ("ddp", "fsdp")], data=("lego",))

# ------------------------------------------------------ the batch rule for several GPUs, on one
add("batch-rule-step", "A: the graphed step alone at B, B/2, B/4, B/8 of lego's and fox's batch, the "
    "gradient's bytes and the table rows one step touches (benchmarks.step_scaling)",
    step_scaling("lego"), step_scaling("fox"), data=("lego", "fox"))
add("batch-rule-shared-work", "the work N ranks share instead of repeating: the GPU time of a rank's 1/N "
    "(N = 1, 2, 4, 8) of the occupancy update and of Adam, beside the step alone at B, 3/4 B and B/2 on lego "
    "and at B on fox (~2 min)",
    step_scaling("lego", "1,0.75,0.5"), step_scaling("fox", "1"), data=("lego", "fox"))
add("batch-rule-large-batch", "B sized: large_batch on lego, k = 4 in 14k reference steps, k = 2 in 10k and "
    "12k, k = 1 in 10k at seeds 2 and 3, fox k = 4 at seed 2 (3000 reference steps) (~5 min)",
    *in_lanes([*sized(4, "large_batch", (14000,)),
               *sized(1, "per_device", (10000,), seed=2), *sized(1, "per_device", (10000,), seed=3),
               *sized(2, "large_batch", (10000, 12000)),
               rule_run("fox", 4, "large_batch", steps=3000, seed=2, tag="_s2")]),
    data=("lego", "fox"))
add("batch-rule-fox-2x", "fox at 2x the batch, large_batch against k = 1, seeds 1-3 (k = 1: 2 and 3), 3000 "
    "reference steps each: may auto use large_batch on 2 GPUs? (~3 min)",
    *in_lanes([rule_run("fox", k, rule, steps=3000, seed=seed, tag=f"_s{seed}")
               for seed in (1, 2, 3) for k, rule in ((2, "large_batch"), (1, "per_device"))
               if (k, seed) != (1, 1)]),
    data=("fox",))
add("batch-rule-seeds-2x", "more seeds where one or two decided: lego k = 2 under large_batch at seeds 2 "
    "and 3 (10k and 12k reference steps), k = 1 in 16k; fox at seed 3, 3000 reference steps: k = 1 and "
    "k = 4 under large_batch (~5 min)",
    *in_lanes([*[j for seed in (2, 3) for j in sized(2, "large_batch", (10000, 12000), seed=seed)],
               *sized(1, "per_device", (16000,)),
               *[rule_run("fox", k, rule, steps=3000, seed=3, tag="_s3")
                 for k, rule in ((1, "per_device"), (4, "large_batch"))]]),
    data=("lego", "fox"))
#: grad_exchange=bf16's rounding of the gradient, on one process (benchmarks/rounded_gradients.py)
BF16_GRADS = (
    "+callbacks.rounded_gradients._target_=benchmarks.rounded_gradients.RoundedGradients",
)
add("batch-rule-bf16", "does the bf16 gradient exchange keep the PSNR? large_batch with every gradient "
    "rounded to bfloat16 before the step (RoundedGradients): lego k = 2 in 10k and 12k reference steps at "
    "seeds 1-3, k = 4 in 16k, beside k = 1 in 10k and 12k at seed 1 (the same run's baseline) (~6 min)",
    *in_lanes([*[j for seed in (1, 2, 3) for j in sized(2, "large_batch", (10000, 12000), *BF16_GRADS,
                                                         tag="_bf16", seed=seed)],
               *sized(4, "large_batch", (16000,), *BF16_GRADS, tag="_bf16"),
               *sized(1, "per_device", (10000, 12000))]),
    data=("lego",))
add("batch-rule-3x", "3 reference batches a step (k = 3), what 4 GPUs train at 3/4 of the batch each: the "
    "step alone at B, 3/4 B and B/2, then in lanes lego k = 3 under large_batch in 11k and 12k reference "
    "steps at seeds 1-3, fox k = 3 at seeds 1-3 (3000 reference steps) (~6 min)",
    step_scaling("lego", "1,0.75,0.5"),
    *in_lanes([*[j for seed in (1, 2, 3) for j in sized(3, "large_batch", (11000, 12000), seed=seed)],
               *[rule_run("fox", 3, "large_batch", steps=3000, seed=seed, tag=f"_s{seed}")
                 for seed in (1, 2, 3)]]),
    data=("lego", "fox"))
add("batch-rule-3x-13k", "where k = 3 crosses lego's 36.2 dB: lego k = 3 under large_batch in 13k "
    "reference steps, and in 12k with every gradient rounded to bfloat16 (RoundedGradients, what "
    "grad_exchange=bf16 sends), seeds 1-3, in lanes (~4 min)",
    *in_lanes([*[j for seed in (1, 2, 3) for j in sized(3, "large_batch", (13000,), seed=seed)],
               *[j for seed in (1, 2, 3) for j in sized(3, "large_batch", (12000,), *BF16_GRADS, tag="_bf16",
                                                      seed=seed)]]),
    data=("lego",))
add("batch-rule-fox-3x-10k", "fox at 3 reference batches a step (4 GPUs at 3/4 each) over a longer run: k = 3"
    " under large_batch against k = 1, 10k reference steps validated every 1000, seeds 1-3, lanes (~5 min)",
    *in_lanes([j for seed in (1, 2, 3) for j in (
        rule_run("fox", 1, "per_device", steps=10000, seed=seed, tag=f"_10k_s{seed}"),
        rule_run("fox", 3, "large_batch", steps=10000, seed=seed, tag=f"_10k_s{seed}"))]),
    data=("fox",))

# ---------------------------------------------------------------------------------- the 2-core CPU
add("cpu-train", "`make train` without a GPU: the CPU preset on the default scene (minutes)",
    train("default", "default", "experiment=cpu", "logger=csv", "callbacks.progress_bar=null",
          quiet=False, gpus=0, expected_s=240, timeout_s=900))
add("cpu-suite", "`make test`: the CPU test suite on two pytest-xdist workers",
    pytest("make_test", "-m", "not cuda and not repro", "-n", "2", "--dist", "loadfile", gpus=0,
           expected_s=70, timeout_s=900))
add("cpu-repro", "`make test-repro`: the fruit-like failure reproduced on a generated capture (minutes)",
    pytest("make_test_repro", "-m", "repro and not cuda", gpus=0, expected_s=270, timeout_s=1200))
add("cpu-resume", "a run killed with SIGKILL and resumed ends bit-identical to the uninterrupted run",
    pytest("kill_9_resume", "tests/run/test_resume.py::test_kill_9_then_same_command_resumes_exactly",
           gpus=0, expected_s=60, timeout_s=600))
add("fruit-cpu-grid", "fruit at 1/16 resolution on the CPU: which part of the hash grid decides (~25 min)",
    module("capture_ab", "benchmarks.capture_ab", "--path", "{data}/fruit", "--cpu-repro",
           "--steps", "400", "--variants", "baseline,small_hash,table_15,levels_8,res_512,res_64,base_512",
           "--out", "{run_dir}/capture_ab.json", read=readers.capture_ab_json, gpus=0,
           expected_s=1500, timeout_s=3600), data=("fruit",))
add("fruit-generated", "the generated fruit-like capture on the CPU: neither fix, each fix alone, both, "
    "the 2^15 table (~10 min)",
    module("capture", "nerf_lightning.data.synthetic", "{run_dir}", "--rig", "phone", "--scene",
           "fruit_bed", "--views", "40", "--width", "37", "--height", "50", "--overwrite", gpus=0,
           expected_s=20, timeout_s=300),
    module("capture_ab", "benchmarks.capture_ab", "--path", "{exp_dir}/capture", "--steps", "400",
           "--variants", "baseline,table_15",
           "--variant",
           "neither=model.net.renderer.near_plane=0.0 model.net.renderer.gradient_scaling_distance=null",
           "--variant", "near_plane_only=model.net.renderer.gradient_scaling_distance=null",
           "--variant", "scaling_only=model.net.renderer.near_plane=0.0", "--common", GENERATED_RECIPE,
           "--out", "{run_dir}/capture_ab.json", read=readers.capture_ab_json, gpus=0,
           expected_s=600, timeout_s=1800))
FOX_20K = ("trainer.max_steps=20000", "hydra.run.dir={run_dir}")
add("process-fox", "fox's 50 photos through `process` (pycolmap on the CPU: carry its cp312 wheel in "
    ".whl), then 20k steps, seeds 1-2, on the recovered poses against the transforms.json fox ships with",
    module("sfm", "nerf_lightning.process", "images={data}/fox/images", "out={exp_dir}/fox_sfm",
           "overwrite=true", "hydra.run.dir={run_dir}",
           read=readers.log_lines(r"^(registered|mean reproj|cameras|aabb_scale|structure)"),
           gpus=0, expected_s=120, timeout_s=900),  # ~300 CPU-seconds on the 2-core CPU machine
    *in_lanes([Job(f"fox_{kind}_s{s}",
                   ("{python}", "-m", "nerf_lightning.train", *QUIET, f"data.path={path}", f"seed={s}",
                    *FOX_20K),
                   read=readers.metrics_json, baseline=None if kind == "shipped" else f"fox_shipped_s{s}",
                   expected_s=cost("fox", 20000)[0], timeout_s=cost("fox", 20000)[1])
               for s in (1, 2) for kind, path in (("shipped", "{data}/fox"), ("sfm", "{exp_dir}/fox_sfm"))],
              n=2), data=("fox",))
# fmt: on
