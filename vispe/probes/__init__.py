"""Position read-out probes and the padding-leakage experiment (Islam, Jia & Bruce, ICLR 2020;
Kayhan & van Gemert, CVPR 2020). Re-exports only; see each module.

The runner's names are re-exported lazily (PEP 562) so that ``python -m vispe.probes.runner`` does
not import the runner twice.
"""
from vispe.probes.backbones import BACKBONES, PADDINGS, build_backbone, resnet18_stages, small_vgg, swap_padding
from vispe.probes.inputs import INPUTS, make_inputs
from vispe.probes.metrics import flat, mae, rank, spc
from vispe.probes.readout import ProbeSettings, ReadoutProbe, evaluate_probe, fit_probe, stack_features
from vispe.probes.targets import TARGETS, target_map, target_stack
from vispe.probes.vit_backbone import VIT_ENCODINGS, build_vit_backbone, parse_vit_spec

__all__ = ["BACKBONES", "PADDINGS", "build_backbone", "small_vgg", "resnet18_stages", "swap_padding",
           "INPUTS", "make_inputs", "flat", "mae", "rank", "spc", "ProbeSettings", "ReadoutProbe",
           "evaluate_probe", "fit_probe", "stack_features", "ExperimentConfig", "SCALES", "config_for",
           "ProbeResult",
           "probe_backbone", "probe_model", "run_experiment", "summary", "TARGETS", "target_map",
           "target_stack", "VIT_ENCODINGS", "build_vit_backbone", "parse_vit_spec"]

_RUNNER = ("ExperimentConfig", "SCALES", "config_for", "ProbeResult", "probe_backbone", "probe_model",
           "run_experiment", "summary")


def __getattr__(name: str):
    if name in _RUNNER:
        from vispe.probes import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'vispe.probes' has no attribute {name!r}")
