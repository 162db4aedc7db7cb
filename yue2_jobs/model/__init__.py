"""The YuE2 model. Importing this package registers `yue2` with the transformers Auto classes
(config, seq2seq model, tokenizer)."""

from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedTokenizerFast

from yue2_jobs.model.configuration_yue2 import PRESETS, Yue2Config
from yue2_jobs.model.generation import MODES, Yue2GenerateOutput, generate
from yue2_jobs.model.modeling_yue2 import Yue2ForConditionalGeneration
from yue2_jobs.model.stats import SequenceStats

AutoConfig.register("yue2", Yue2Config, exist_ok=True)
AutoModelForSeq2SeqLM.register(Yue2Config, Yue2ForConditionalGeneration, exist_ok=True)
AutoTokenizer.register(Yue2Config, fast_tokenizer_class=PreTrainedTokenizerFast, exist_ok=True)

__all__ = ["MODES", "PRESETS", "SequenceStats", "Yue2Config", "Yue2ForConditionalGeneration", "Yue2GenerateOutput",
           "generate"]
