"""Image and video tokens: the VQ tokenizer (`vq`), the conditioned token models (`models`, `conditions`) and
`ImageGenerator` (`generator`); their data sets, trainers and quality measures in `training/`. The decoding algorithms are
modality-agnostic and live in the core: Jacobi decoding (SJD, MC-SJD, Gumbel coupling) in
`specgen.samplers.jacobi`, classifier-free guidance batching in `specgen.samplers.guided`."""


def __getattr__(name: str):
    if name == "ImageGenerator":  # loaded on first use: importing the package stays cheap
        from specgen.modalities.image.generator import ImageGenerator

        return ImageGenerator
    raise AttributeError(f"module 'specgen.modalities.image' has no attribute {name!r}")
