"""The default datasets of ``gsd rank`` and ``gsd train``, in a module that imports nothing, so that the
CLI's help text can name them without loading torch (:mod:`gsd_cli.data.embedded` defines the sets)."""

DEFAULT_PRIVATE = "mnist-a"
DEFAULT_PUBLIC = ("mnist-b", "digits", "mnist-inverted", "textures", "faces", "noise")
