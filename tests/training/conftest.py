"""The tiny-model fixtures (`tests.tiny_models`)."""

from tests.tiny_models import bart_batch, tiny_config, tiny_yue2, varied_bart  # noqa: F401 - fixtures
