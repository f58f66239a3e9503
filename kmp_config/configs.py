"""The examples' settings, as dataclasses whose fields are the flags.

    RunConfig      what every example takes: policy, epochs, batch_size,
                   steps, data, seed, strategy, output_dir, ...
    Cifar10Config  examples/cifar10.py's `Config`: + width
    ImdbConfig     examples/imdb.py's `Config`: + model, d_model, heads,
                   layers, sequence_length, vocabulary_size, float8
    LmConfig       examples/lm.py's `Config`: + hidden_dim,
                   heads, layers, sequence_length, text_bytes, float8,
                   remat, dropout
    EXAMPLES       an example's name -> its config class
    CLASSIFIERS    the examples `kmp bench` and `kmp doctor` take

Every field is a command-line flag of `kmp train`, `kmp doctor` and of
the example run as a script (absl syntax, `--batch_size=128`). The
configs live here, beside the command's parser and outside the `kmp`
package, because this module imports neither Keras nor kmp: the command
checks every flag, an example's own ones included, before TensorFlow
loads, and refuses a bad one at once.

A config's `problem()` names its first bad field (the command prints
it, Keras not loaded); `check()` raises it as `kmp.InputError` (the
examples' `train`). Besides its flags, a config says which of its fields
an interrupted run must keep to resume from its backup (all but
`RESUMES_WITH_CHANGED`) and the sizes to use where there is no GPU
(`CPU_SIZES`). An example's config also declares, as class attributes
(not flags), what the commands around its `train` need of it:

    LAYOUT           `--distribution=model`: kernel path pattern -> the
                     axes of its dimensions, "model" where it is split
    LAYOUT_SPLITS    the fields that must divide over the "model" axis
    BENCH_SIZES      `kmp bench`'s fields on a CPU ("small") and a GPU
                     ("full") (the classifiers)
    BENCH_FLOAT8     whether `kmp bench --float8` times `kmp.float8`
                     variants of it
    BENCH_OPTIMIZER  the optimizer `kmp bench` trains it with, as Keras
                     serializes one (`keras.optimizers.get` reads it)
"""

import dataclasses
import os

from kmp_config import names
from kmp_config.errors import InputError

STRATEGIES = ("none", "mirrored", "multiworker")
DISTRIBUTIONS = ("none", "data", "model")
SOURCES = ("auto", "tfds", "synthetic")
# Help texts of fields whose examples change only the default.
OUTPUT_DIR_HELP = (
    "Where results go, and the backup an interrupted run resumes from."
)
SYNTHETIC_SIZE_HELP = (
    "Training examples of synthetic data; its test split is a fifth of that."
)


def _tf_config() -> str:
    """The `TF_CONFIG` environment variable, stripped ("" when unset)."""
    return os.environ.get("TF_CONFIG", "").strip()


def flag(default, help, choices=None, lower_bound=None, words=None):
    """A config field that is also a command-line flag.

    Args:
        default: The value when the flag is not given.
        help: The flag's help text.
        choices: The values allowed, or `None` for any.
        lower_bound: The smallest number allowed, or `None`.
        words: For a number: words it also takes, each standing for a
            value below `lower_bound` (`{"max": 0}`), or `None`.
    """
    metadata = {
        "help": help,
        "choices": choices,
        "lower_bound": lower_bound,
        "words": words or {},
    }
    return dataclasses.field(default=default, metadata=metadata)


# `--batch_size=max`: the config holds 0, which no batch can be.
MAX_BATCH = 0


def batch_flag(default, help):
    """The batch size: a number, or `max` (the largest that fits)."""
    return flag(
        default,
        help + " max: the largest whose compiled train step fits "
        "--memory_limit, found before training (JAX).",
        lower_bound=1,
        words={"max": MAX_BATCH},
    )


def bytes_flag(default, help):
    """A size in bytes: a number, with or without a unit (`2G`,
    `512MiB`; `kmp_config.flags.parse_bytes`)."""
    field = flag(
        default,
        help + " Bytes, or with K, M, G or T (powers of 1024, alone or "
        "with B or iB: 2G = 2GB = 2GiB = 2 * 2**30; 1.5G, 512MiB).",
        lower_bound=0,
    )
    return dataclasses.field(
        default=default, metadata={**field.metadata, "unit": "bytes"}
    )


@dataclasses.dataclass
class RunConfig:
    """The flags every example takes; each example subclasses it."""

    policy: str = flag(
        "auto", "Dtype policy; auto picks by hardware.", names.POLICIES
    )
    epochs: int = flag(10, "Epochs.", lower_bound=1)
    batch_size: int = batch_flag(64, "Global batch (all replicas).")
    memory_limit: int = bytes_flag(
        0,
        "What a train step may take, for --batch_size=max (0: the "
        "accelerator's memory; on a CPU, 4G or half the memory available, "
        "the smaller).",
    )
    steps: int = flag(
        0,
        "Steps per epoch; 0 means all. Also bounds validation (the same "
        "share of the test split) unless --eval_steps is set.",
        lower_bound=0,
    )
    eval_steps: int = flag(
        0,
        "Validation steps; 0 means all, or with --steps the same share "
        "of the test split as --steps is of the training split.",
        lower_bound=0,
    )
    data: str = flag("auto", "Data source.", SOURCES)
    data_dir: str = flag("", "TFDS data directory (default: TFDS's).")
    output_dir: str = flag("runs", OUTPUT_DIR_HELP)
    restart: bool = flag(
        False,
        "Delete the backup of an interrupted run in --output_dir and start "
        "over (without it, a rerun resumes, with the same flags).",
    )
    seed: int = flag(0, "Random seed.")
    strategy: str = flag(
        "none",
        "TensorFlow: where the replicas are (tf.distribute).",
        STRATEGIES,
    )
    distribution: str = flag(
        "none",
        "JAX: keras.distribution over every device: data (DataParallel) "
        "or model (ModelParallel, the example's layout of its kernels).",
        DISTRIBUTIONS,
    )
    coordinator: str = flag(
        "",
        "JAX, many processes: process 0's HOST:PORT (a free port), or "
        "'auto' on a cluster JAX detects; with --distribution. Default: "
        "Keras's KERAS_DISTRIBUTION_* environment, else one process.",
    )
    num_processes: int = flag(
        1, "JAX, many processes: how many (with --coordinator).", lower_bound=1
    )
    process_id: int = flag(
        0,
        "JAX, many processes: this one's id, 0..num_processes-1 (0 "
        "writes the results and the model).",
        lower_bound=0,
    )
    process_timeout: float = flag(
        300.0,
        "JAX, many processes: seconds to wait for every process to come, "
        "and for one that stops answering, before the others end.",
    )
    learning_rate: float = flag(1e-3, "Peak learning rate.")
    optimizer_states: str = flag(
        "float32",
        "The dtype of the optimizer's slots (Adam's moments, SGD's "
        "momentum); bfloat16 halves them, the update still in float32; "
        "int8 stores Adam's, AdamW's, Lion's and SGD's as 8-bit codes in "
        "blocks of 256 with a float32 scale each (slots under 256 "
        "elements stay float32).",
        names.STATE_DTYPES,
    )
    master_weights: str = flag(
        "float32",
        "The dtype trainable weights are stored in; bfloat16 (with "
        "--policy=mixed_bfloat16) halves them, each update rounded "
        "stochastically under --seed.",
        names.MASTER_WEIGHTS,
    )
    synthetic_size: int = flag(25_000, SYNTHETIC_SIZE_HELP, lower_bound=1)
    verbose: int = flag(
        1,
        "fit's verbosity: 0 silent, 1 a progress bar, 2 a line per epoch "
        "(kmp train's default where stdout is no terminal, or NO_COLOR is "
        "set).",
        lower_bound=0,
    )
    compile_cache: str = flag(
        "auto",
        "Persistent XLA compilation cache: a directory, 'auto' (~/.cache/"
        "kmp/xla, on backends that have one) or 'off'.",
    )

    # What a rerun may change and still resume the interrupted run: how
    # long it goes on, how it validates and reports, where things are.
    # Every other field shapes the weights, the optimizer or the data.
    RESUMES_WITH_CHANGED = (
        "epochs",
        "eval_steps",
        "verbose",
        "output_dir",
        "restart",
        "data_dir",
        "strategy",
        "distribution",
        "compile_cache",
        "coordinator",
        "num_processes",
        "process_id",
        "process_timeout",
    )
    # Sizes for a machine without a GPU, where the user did not set them
    # (`cpu_sized`); an example with GPU-sized defaults overrides it.
    CPU_SIZES = {}

    def problem(self) -> str | None:
        """The first bad field, as the message that says so, or `None`.

        Imports nothing: the `kmp` command asks it before Keras loads.
        """
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            choices = field.metadata.get("choices")
            low = field.metadata.get("lower_bound")
            if choices and value not in choices:
                return (
                    f"{field.name} must be one of {', '.join(choices)}; "
                    f"got {value!r}."
                )
            words = field.metadata.get("words") or {}
            if low is not None and value < low and value not in words.values():
                return f"{field.name} must be >= {low}, got {value}."
        if not self.learning_rate > 0:
            return f"learning_rate must be > 0, got {self.learning_rate}."
        if self.strategy != "none" and self.distribution != "none":
            return (
                f"--strategy={self.strategy} (TensorFlow) and "
                f"--distribution={self.distribution} (JAX) are two engines; "
                "give the one of your backend."
            )
        many = self.coordinator or self.num_processes > 1
        if many and self.distribution == "none":
            return (
                "--coordinator and --num_processes start many JAX processes, "
                "which need --distribution=data or model (a mesh over every "
                "process's devices); on TensorFlow, workers come from "
                "TF_CONFIG with --strategy=multiworker."
            )
        if self.process_id >= self.num_processes:
            return (
                f"process_id={self.process_id} with num_processes="
                f"{self.num_processes}: the ids are 0..num_processes-1."
            )
        if not self.process_timeout > 0:
            return f"process_timeout must be > 0, got {self.process_timeout}."
        if self.master_weights == "bfloat16":
            if self.policy not in ("auto", "mixed_bfloat16"):
                return (
                    "--master_weights=bfloat16 computes in bfloat16: use "
                    f"--policy=mixed_bfloat16, not {self.policy}."
                )
            if getattr(self, "float8", False):
                return (
                    "--master_weights=bfloat16 with --float8 is not "
                    "supported: drop one of them."
                )
        return None

    def check(self):
        """Raises `kmp.InputError` naming the first bad field, or a
        multi-worker run without its cluster; returns the config. (That
        the cluster is well formed, `kmp.multi_worker_strategy` checks,
        when the run makes its strategy.)"""
        problem = self.problem()
        if problem:
            raise InputError(problem)
        if self.strategy == "multiworker" and not _tf_config():
            raise InputError(
                "strategy=multiworker needs TF_CONFIG, the cluster (every "
                "worker's host:port) and this worker's index, e.g. "
                'TF_CONFIG=\'{"cluster": {"worker": ["host1:12345", '
                '"host2:12345"]}, "task": {"type": "worker", "index": 0}}\' '
                "(README, Beyond one machine). On one machine use "
                "strategy=mirrored or none."
            )
        return self

    def cpu_sized(self, explicit=()):
        """`(config, changes)`: this config with `CPU_SIZES` for the
        fields not in `explicit` (the flags the user gave), and the
        changes made. Unchanged when the result would not be valid (a
        `--heads` that the CPU `d_model` does not divide)."""
        changes = {
            name: value
            for name, value in self.CPU_SIZES.items()
            if name not in explicit and getattr(self, name) != value
        }
        sized = dataclasses.replace(self, **changes)
        if not changes or sized.problem():
            return self, {}
        return sized, changes

    def resume_key(self) -> dict:
        """The fields a rerun must keep to resume this run's backup."""
        return {
            name: value
            for name, value in dataclasses.asdict(self).items()
            if name not in self.RESUMES_WITH_CHANGED
        }


@dataclasses.dataclass
class Cifar10Config(RunConfig):
    """ResNet-9 on CIFAR-10 (examples/cifar10.py)."""

    batch_size: int = batch_flag(512, "Global batch.")
    output_dir: str = flag("runs/cifar10", OUTPUT_DIR_HELP)
    learning_rate: float = flag(
        0.2, "Peak learning rate at batch 512 (scaled with the batch)."
    )
    width: int = flag(
        64, "Channels of the first block (64: ResNet-9).", lower_bound=8
    )
    synthetic_size: int = flag(50_000, SYNTHETIC_SIZE_HELP, lower_bound=1)
    remat: bool = flag(
        False,
        "Recompute each ReLU and pooling in the backward pass instead of "
        "keeping its output (kmp.rematerialize): less memory, more compute.",
    )

    # Batch 512 at width 64 is a GPU's size: on a 2-core CPU, 10 steps
    # took 380-900 s. A step's work goes with width^2 x batch: a 64th.
    CPU_SIZES = {"batch_size": 128, "width": 16}

    # Every convolution's output channels split over "model" (the wide
    # layers hold most weights).
    LAYOUT = {r"conv2d(_\d+)?/kernel": (None, None, None, "model")}
    LAYOUT_SPLITS = ("width",)
    BENCH_SIZES = {
        "small": {"width": 16, "batch_size": 64},
        "full": {"width": 64, "batch_size": 512},
    }
    # A convnet has no matmuls for kmp.float8 to speed up but its head.
    BENCH_FLOAT8 = False
    # A constant rate: the bench times steps, it schedules nothing.
    BENCH_OPTIMIZER = {
        "class_name": "SGD",
        "config": {"learning_rate": 0.01, "momentum": 0.9},
    }


@dataclasses.dataclass
class ImdbConfig(RunConfig):
    """A Transformer encoder (or BiLSTM) on IMDB (examples/imdb.py)."""

    epochs: int = flag(3, "Epochs.", lower_bound=1)
    output_dir: str = flag("runs/imdb", OUTPUT_DIR_HELP)
    learning_rate: float = flag(5e-4, "Peak learning rate (AdamW).")
    model: str = flag("transformer", "Architecture.", ("transformer", "bilstm"))
    d_model: int = flag(128, "Embedding width.", lower_bound=8)
    heads: int = flag(4, "Attention heads (they split d_model).", lower_bound=1)
    layers: int = flag(2, "Encoder blocks.", lower_bound=1)
    sequence_length: int = flag(256, "Tokens per review.", lower_bound=8)
    vocabulary_size: int = flag(20_000, "Vocabulary.", lower_bound=8)
    float8: bool = flag(
        False,
        "Attention and feed-forward matmuls in float8 (kmp.float8): fast "
        "on H100/H200 tensor cores, slow on a CPU.",
    )

    # The sizes benchmarks/parity.py measures on a CPU.
    CPU_SIZES = {"batch_size": 32, "d_model": 64, "sequence_length": 128}

    # Megatron's split over "model": each attention's heads, and each
    # feed-forward layer's hidden units (the up projection by columns,
    # the down projection by rows, so each device multiplies its part).
    LAYOUT = {
        r"attention_\d+/(query|key|value)/kernel": (None, "model", None),
        r"attention_\d+/attention_output/kernel": ("model", None, None),
        r"ffn_up_\d+/kernel": (None, "model"),
        r"ffn_down_\d+/kernel": ("model", None),
    }
    LAYOUT_SPLITS = ("heads", "d_model")
    # A GPU's size: d_model >= 512.
    BENCH_SIZES = {
        "small": {"d_model": 64, "batch_size": 32, "sequence_length": 128},
        "full": {"d_model": 512, "batch_size": 64, "sequence_length": 256},
    }
    # The attention projections and feed-forward matmuls.
    BENCH_FLOAT8 = True
    # Adam at 1e-4: SGD at 0.01 drove the d_model 512 encoder to one
    # class (loss 7.3 in every variant, measured on an H100, 2026-11-22).
    BENCH_OPTIMIZER = {"class_name": "Adam", "config": {"learning_rate": 1e-4}}

    def problem(self) -> str | None:
        problem = super().problem()
        if problem is None and self.d_model % self.heads:
            problem = (
                f"d_model ({self.d_model}) must be a multiple of heads "
                f"({self.heads}): each head gets d_model / heads "
                "dimensions. Change --d_model or --heads."
            )
        return problem


@dataclasses.dataclass
class LmConfig(RunConfig):
    """A KerasHub GPT-2 causal LM from a config, on bytes of text
    (examples/lm.py)."""

    policy: str = flag(
        "mixed_bfloat16",
        "Dtype policy (float8 needs mixed_bfloat16 or mixed_float16).",
        names.POLICIES,
    )
    epochs: int = flag(2, "Epochs.", lower_bound=1)
    batch_size: int = batch_flag(32, "Global batch of sequences.")
    output_dir: str = flag("runs/lm", OUTPUT_DIR_HELP)
    learning_rate: float = flag(6e-4, "Peak learning rate (AdamW).")
    data: str = flag(
        "auto",
        "auto: the Python standard library's own source files, read as "
        "bytes (they ship with Python); synthetic: generated sequences.",
        ("auto", "synthetic"),
    )
    hidden_dim: int = flag(512, "Model width.", lower_bound=16)
    heads: int = flag(
        8, "Attention heads (they split hidden_dim).", lower_bound=1
    )
    layers: int = flag(8, "Transformer decoder blocks.", lower_bound=1)
    sequence_length: int = flag(512, "Bytes per sequence.", lower_bound=8)
    text_bytes: int = flag(
        20_000_000,
        "Bytes of text to train on (a tenth more to test).",
        lower_bound=1_000,
    )
    float8: bool = flag(
        False,
        "Every Dense and attention projection in float8 (kmp.float8): "
        "fast on H100/H200 tensor cores, slow on a CPU.",
    )
    float8_matmul: str = flag(
        "auto",
        "With --float8: kmp computes each layer with kmp's own float8 "
        "matmul (JAX and torch; faster on an H200 with JAX, "
        "BENCHMARKS.md); keras as Keras's float8 does; auto picks kmp on "
        "JAX and torch, keras on TensorFlow.",
        ("auto", "keras", "kmp"),
    )
    remat: bool = flag(
        False,
        "Recompute each decoder block in the backward pass, keeping only "
        "its input (kmp.rematerialize): less memory, more compute.",
    )
    dropout: float = flag(
        0.1,
        "Dropout rate of the decoder blocks and their attention, in [0, "
        "1). 0 lets Keras fuse attention (cuDNN flash attention on a "
        "GPU); 0.1 is KerasHub's GPT-2 default, which keeps it unfused.",
        lower_bound=0.0,
    )

    # A 2-core CPU's size: about a second a step (BENCHMARKS.md).
    CPU_SIZES = {
        "batch_size": 8,
        "hidden_dim": 64,
        "heads": 4,
        "layers": 2,
        "sequence_length": 128,
        "text_bytes": 400_000,
    }

    def problem(self) -> str | None:
        problem = super().problem()
        if problem is None and self.hidden_dim % self.heads:
            problem = (
                f"hidden_dim ({self.hidden_dim}) must be a multiple of heads "
                f"({self.heads}): each head gets hidden_dim / heads "
                "dimensions. Change --hidden_dim or --heads."
            )
        if problem is None and not self.dropout < 1:
            problem = (
                f"dropout must be in [0, 1), got {self.dropout}: a rate of "
                "1 drops everything. Use 0 for none (fused attention) or "
                "0.1, KerasHub's default."
            )
        if problem is None and self.strategy != "none":
            problem = (
                f"strategy={self.strategy}: the lm example runs on one "
                "device, or on JAX under --distribution=data."
            )
        if (
            problem is None
            and self.float8
            and self.policy
            not in (
                "mixed_bfloat16",
                "mixed_float16",
            )
        ):
            problem = (
                f"--float8 trains under mixed_bfloat16 or mixed_float16, "
                f"not {self.policy}: drop --policy or --float8."
            )
        return problem


EXAMPLES = {"cifar10": Cifar10Config, "imdb": ImdbConfig, "lm": LmConfig}
# The classifiers, which `kmp bench` times and `kmp doctor` examines.
CLASSIFIERS = ("cifar10", "imdb")
