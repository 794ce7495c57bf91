"""Training and evaluation of ViTs (and later detectors) with any registered encoding.

``train.py`` at the repository root is the entry point; the pieces, one concept each:

* ``config``      typed dataclasses, YAML + checked command-line overrides
* ``tasks``       what is built and how a batch is scored, by ``task.name`` (classification)
* ``loaders``     DataLoaders whose order and augmentation depend only on (seed, epoch, index)
* ``engine``      one training epoch, one evaluation pass (autocast, clipping, reduced metrics)
* ``checkpoint``  atomic checkpoints with everything needed to resume exactly; compatibility check
* ``logging``     metrics.csv, TensorBoard, curves.png, summary.json, comparison table
* ``distributed`` torchrun / torch.distributed set-up, reductions (gloo on CPU, NCCL on GPU)
* ``rundir``      the run folder and the rules that keep finished runs safe
* ``runner``      one encoding's run, from building to the multi-size evaluation
"""
