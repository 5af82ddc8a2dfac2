"""The whole model on v41 kernels: checkpoint weights in the kernels' ABI form
(:mod:`harness.model.weights`) and one forward over the layer schedule
(:mod:`harness.model.forward`) that ``python -m harness.generate`` drives."""
