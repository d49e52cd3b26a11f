"""The checks of a loaded Config across its fields: impossible values and combinations, each one
line naming the field and what would be accepted, before any work starts. `validate` runs them
all, after every number has its range (limits.py) and every path its form (paths.py); what needs
the user's modules, an env or a server comes later, still before any model (runtime/assembly/preflight.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from agentrl.config.limits import check_limits
from agentrl.config.paths import check_config_paths
from agentrl.config.runtime import ADDRESS_FORM, RoleConfig, RuntimeConfig
from agentrl.config.serve import check_allowed_hosts, is_loopback
from agentrl.errors import ConfigError, did_you_mean, shown

if TYPE_CHECKING:  # loading.py calls validate; the types only are needed here
    from agentrl.config.schema import Config

def validate(cfg: Config) -> None:
    """Reject impossible combinations before any work starts."""
    r, a, t = cfg.rollout, cfg.actor, cfg.trainer
    check_engine_kind(cfg)  # as the type of a field: before any range
    check_limits(cfg)  # first: every number has its range, so every size below is bounded
    check_config_paths(cfg)
    if r.batch_size % r.group_size:
        raise ConfigError(
            f"rollout.batch_size={r.batch_size} is not a multiple of rollout.group_size={r.group_size}; "
            f"use a batch_size like {max(1, r.groups_per_step) * r.group_size}"
        )
    if r.batch_size % a.ppo_mini_batch_size:
        raise ConfigError(
            f"rollout.batch_size={r.batch_size} is not a multiple of actor.ppo_mini_batch_size="
            f"{a.ppo_mini_batch_size}"
        )
    if a.ppo_mini_batch_size % a.micro_batch_size:
        raise ConfigError(
            f"actor.ppo_mini_batch_size={a.ppo_mini_batch_size} is not a multiple of "
            f"actor.micro_batch_size={a.micro_batch_size}"
        )
    if len(a.betas) != 2:
        raise ConfigError(f"actor.betas={a.betas} must be two numbers in [0, 1)")
    _validate_algorithm(cfg)
    _validate_curriculum(cfg)
    check_model_section(cfg)
    _validate_env_groups(cfg)
    validate_serve(cfg)
    cfg.health.check()
    if "wandb" in t.logger:
        from agentrl.wandb_sink import check_installed

        check_installed()
    check_runtime(cfg)
    if cfg.model.path is not None and not Path(cfg.model.path).expanduser().is_dir():
        raise ConfigError(f"model.path={cfg.model.path!r}: no such directory (expected a local "
                          "Hugging Face model folder with config.json)")


def _validate_algorithm(cfg: Config) -> None:
    # adv_estimator names are checked against the registry when the runtime builds the run.
    alg, a, c = cfg.algorithm, cfg.actor, cfg.critic
    if alg.adv_estimator == "gae" and not c.enable:
        raise ConfigError("algorithm.adv_estimator=gae needs a value model: set critic.enable=true "
                          "(and critic.lr, critic.cliprange_value as needed)")
    if c.enable:
        if cfg.rollout.batch_size % c.ppo_mini_batch_size or c.ppo_mini_batch_size % c.micro_batch_size:
            raise ConfigError(f"critic.ppo_mini_batch_size={c.ppo_mini_batch_size} must divide rollout.batch_size="
                              f"{cfg.rollout.batch_size} and be a multiple of critic.micro_batch_size="
                              f"{c.micro_batch_size}")
    if cfg.rollout.on_truncation == "bootstrap" and not (c.enable and alg.adv_estimator == "gae"):
        raise ConfigError(f"rollout.on_truncation=bootstrap takes the critic's value of a truncated episode's last "
                          f"state, but algorithm.adv_estimator={alg.adv_estimator} uses no critic; set "
                          "algorithm.adv_estimator=gae with critic.enable=true, or use on_truncation=zero or drop")
    if a.use_decoupled_loss and a.tis_imp_ratio_cap > 0:
        raise ConfigError("actor.use_decoupled_loss=true and actor.tis_imp_ratio_cap>0 both reweight by "
                          "pi_old / pi_behaviour; choose one")
    _validate_policy_loss(cfg)


# The modes agentrl.algos.policy_losses registers; named here so that a config error needs no torch.
BUILTIN_POLICY_LOSSES = ("cispo", "geo_mean", "gmpo", "gpg", "gspo", "sapo", "vanilla")


def _validate_policy_loss(cfg: Config) -> None:
    """actor.policy_loss: a known loss mode (user modes may come from `imports`), positive taus."""
    from agentrl.registry import POLICY_LOSSES

    p = cfg.actor.policy_loss
    known = sorted(set(BUILTIN_POLICY_LOSSES) | set(POLICY_LOSSES.names()))
    # A module in `imports` may register more modes: those are checked once it is imported.
    if not cfg.imports and p.loss_mode not in known:
        raise ConfigError(f"actor.policy_loss.loss_mode: unknown policy loss mode {shown(p.loss_mode)}."
                          f"{did_you_mean(p.loss_mode, known)} Known: {', '.join(known)}")
    if cfg.algorithm.adv_estimator == "grpo_passk" and cfg.rollout.group_size < 2:
        raise ConfigError(f"algorithm.adv_estimator=grpo_passk compares the two best episodes of a group: "
                          f"set rollout.group_size >= 2 (got {cfg.rollout.group_size})")


# The rules agentrl.rollout.curriculum registers; named here so that a config error needs no import.
BUILTIN_CURRICULUM_RULES = ("informative",)


def _validate_curriculum(cfg: Config) -> None:
    """rollout.curriculum: ordered thresholds, a known rule, a rollout it can steer."""
    from agentrl.registry import CURRICULUM_RULES

    c = cfg.rollout.curriculum
    if c.hard_threshold >= c.easy_threshold:
        raise ConfigError(f"rollout.curriculum.hard_threshold={c.hard_threshold} must be below "
                          f"rollout.curriculum.easy_threshold={c.easy_threshold} (the rule draws the tasks between "
                          "them)")
    known = sorted(set(BUILTIN_CURRICULUM_RULES) | set(CURRICULUM_RULES.names()))
    if not cfg.imports and c.rule not in known:  # a module in `imports` may register it (checked once imported)
        raise ConfigError(f"rollout.curriculum.rule: unknown curriculum rule {shown(c.rule)}."
                          f"{did_you_mean(c.rule, known)} Known: {', '.join(known)}")
    if c.enable and cfg.rollout.max_staleness:
        raise ConfigError(f"rollout.curriculum.enable=true with rollout.max_staleness={cfg.rollout.max_staleness}: a "
                          "curriculum draws each step's tasks from the estimates of the steps before, which a stream "
                          "plays ahead of; use rollout.max_staleness=0")


def _validate_env_groups(cfg: Config) -> None:
    """Named envs and the tags and group counts of both env managers."""
    if cfg.custom_envs and cfg.env != type(cfg.env)():
        raise ConfigError("both env and custom_envs are set: env is the shorthand for a one-env run; with "
                          "custom_envs, define every env there and leave env at its defaults")
    for name in cfg.custom_envs:
        if not name or "/" in name or name != name.strip():
            raise ConfigError(f"custom_envs name {name!r} must be non-empty, without '/' or outer spaces "
                              "(it becomes the metric prefix env/<name>/)")
    known = list(cfg.env_definitions())
    for split in ("train", "val"):
        manager = getattr(cfg, f"{split}_env_manager")
        for tag in manager.tags:
            if tag not in known:
                raise ConfigError(f"{split}_env_manager.tags: unknown tag '{tag}'.{did_you_mean(tag, known)} "
                                  f"Defined: {', '.join(known)}")
        if len(set(manager.tags)) != len(manager.tags):
            raise ConfigError(f"{split}_env_manager.tags={manager.tags} names a tag twice; give each tag once "
                              "with its count in n_groups")
        cfg.group_tags(split)  # raises on a count mismatch or an uneven split


# ---------------------------------------------------------------------------- model
def check_model_section(cfg: Config) -> None:
    """model.lora and the token budgets: one line naming the field, before anything is built."""
    lora = cfg.model.lora
    if lora.enabled and cfg.engine.kind == "remote" and cfg.engine.protocol != "agentrl":
        # An agentrl server takes adapters on /agentrl/adapter; a vLLM or SGLang server reloads whole folders.
        raise ConfigError(f"model.lora.rank={lora.rank} with engine.kind=remote needs engine.protocol=agentrl (an "
                          f"`agentrl serve` server loads adapters), not {cfg.engine.protocol}; for vLLM use "
                          "engine.kind=vllm, which loads them as LoRA adapters")
    if lora.enabled:
        names = lora.target_modules
        if not names or not all(isinstance(n, str) and n.strip() for n in names):
            raise ConfigError(f"model.lora.target_modules={names} must name at least one linear layer "
                              "(e.g. [q_proj, v_proj]) or be [all-linear]")
        if "all-linear" in names and len(names) > 1:
            raise ConfigError(f"model.lora.target_modules={names}: all-linear already names every linear "
                              "layer; give it alone or list the layers")
    sharing = [f"{name}.share_prefixes" for name, role in (("actor", cfg.actor), ("critic", cfg.critic))
               if role.share_prefixes]
    if sharing and cfg.model.enable_gradient_checkpointing:
        # The suffixes read the prefix's KV cache, which transformers drops in checkpointed layers.
        raise ConfigError(f"{sharing[0]}=true reads a shared prefix's KV cache, which "
                          "model.enable_gradient_checkpointing=true drops in training; turn one of them off")


# ---------------------------------------------------------------------------- engine and serve
# The kinds runtime/assembly/engine_kinds/ registers (named here so that a config error needs no
# import), and those of them that generate on inference servers. This module and the registry
# are the only places that tell engine kinds apart by name: the run asks the kind's object.
BUILTIN_ENGINE_KINDS = ("local", "remote", "vllm")
SERVED_ENGINE_KINDS = ("remote", "vllm")


def check_engine_kind(cfg: Config) -> None:
    """engine.kind names a known kind (a module in `imports` may register more: checked once it is
    imported, by the run plan)."""
    if not cfg.imports:
        check_engine_kind_name(cfg.engine.kind)


def check_engine_kind_name(kind: str) -> None:
    """`kind` is a built-in or registered engine kind: one line naming engine.kind and the kinds."""
    from agentrl.registry import ENGINE_KINDS

    known = [*BUILTIN_ENGINE_KINDS, *(n for n in ENGINE_KINDS.names() if n not in BUILTIN_ENGINE_KINDS)]
    if kind not in known:
        choices = ", ".join(repr(k) for k in known)
        raise ConfigError(f"engine.kind={shown(kind)} is not allowed; choose one of {choices}."
                          f"{did_you_mean(str(kind), known)}")


def validate_serve(cfg: Config) -> None:
    """The engine placement and serve sections: one line per bad value."""
    e, s = cfg.engine, cfg.serve
    if e.kind == "remote" and not e.urls:
        raise ConfigError("engine.kind=remote needs engine.urls, e.g. engine.urls=[http://127.0.0.1:8000] "
                          "(start one with `agentrl serve CONFIG`)")
    for i, url in enumerate(e.urls):
        check_url(url, f"engine.urls[{i}]")
    if e.api_key is not None and e.api_key_file is not None:
        raise ConfigError("engine.api_key and engine.api_key_file are both set; give the key one way")
    if len(set(e.urls)) != len(e.urls):
        raise ConfigError(f"engine.urls={e.urls} names a server twice; list each once")
    if e.kind == "remote" and e.protocol in ("vllm", "sglang") and not e.weights_dir:
        raise ConfigError(f"engine.protocol={e.protocol} loads new weights from disk: set engine.weights_dir to "
                          f"the folder the {e.protocol} servers were started with (a disk they share with training)")
    if e.kind == "vllm":
        check_vllm(cfg)
    if not s.host.strip():
        raise ConfigError("serve.host must name an interface, e.g. 127.0.0.1")
    check_allowed_hosts(s.allowed_hosts)
    for name, key in (("engine.api_key", e.api_key), ("serve.api_key", s.api_key)):
        if key is not None:
            check_api_key(key, name)
    if not is_loopback(s.host) and s.api_key is None:
        raise ConfigError(f"serve.host={shown(s.host)} is not a loopback address (127.x, ::1 or localhost; a name "
                          "is not resolved): it would expose the server beyond this machine: set serve.api_key too "
                          "(or keep serve.host=127.0.0.1)")


# Server arguments agentrl sets itself for the vLLM servers it starts (llm/vllm/launch.py), and why
VLLM_OWN_ARGS = {
    "--model": "the run's model folder", "--host": "loopback: vLLM's API key does not guard its RL routes",
    "--port": "a free port", "--api-key": "a random key", "--dtype": "model.dtype, the trainer's",
    "--logprobs-mode": "processed_logprobs, the trainer's", "--weight-transfer-config": "agentrl's transport",
    "--worker-extension-cls": "agentrl's transport",
}
VLLM_LORA_RANK_MAX = 512  # vLLM's largest --max-lora-rank


def check_vllm(cfg: Config) -> None:
    """engine.kind=vllm: its section, attach mode, and the sampling whose logprobs vLLM reports as the trainer's."""
    e, v, r = cfg.engine, cfg.engine.vllm, cfg.rollout
    for arg in v.args:
        flag = arg.split("=", 1)[0]
        if flag in VLLM_OWN_ARGS:
            raise ConfigError(f"engine.vllm.args holds {shown(arg)}: agentrl sets {flag} itself "
                              f"({VLLM_OWN_ARGS[flag]}); drop it")
    if e.urls and not e.weights_dir:
        raise ConfigError("engine.kind=vllm with engine.urls attaches to running servers: set engine.weights_dir to "
                          "their weights folder (the AGENTRL_VLLM_WEIGHTS_DIR they were started with, on a disk "
                          "shared with training)")
    if e.urls and v.replicas != 1:
        raise ConfigError(f"engine.vllm.replicas={v.replicas} with engine.urls: the run starts no server and uses "
                          f"the {len(e.urls)} of engine.urls; drop one of the two")
    # vLLM reports logprobs after top-p/top-k filtering, renormalised; the trainer recomputes them
    # over the whole vocabulary: every ratio would be off by up to 0.1 nats (measured at top_p=0.9).
    for name, value, off in (("rollout.top_p", r.top_p, r.top_p >= 1.0), ("rollout.top_k", r.top_k, r.top_k <= 0)):
        if not off:
            raise ConfigError(f"{name}={value} with engine.kind=vllm: vLLM's logprobs are of the filtered, "
                              "renormalised distribution and the trainer's of the whole one (a gap the importance "
                              "ratios would take for policy drift); use rollout.top_p=1.0 and rollout.top_k=-1, "
                              "or engine.kind=local")
    if v.weight_transfer == "nccl" and cfg.device == "cpu":
        raise ConfigError("engine.vllm.weight_transfer=nccl broadcasts from the trainer's GPU, and device=cpu: use "
                          "engine.vllm.weight_transfer=file (or device=cuda on a GPU machine)")
    if cfg.model.lora.rank > VLLM_LORA_RANK_MAX:
        raise ConfigError(f"model.lora.rank={cfg.model.lora.rank} with engine.kind=vllm: vLLM serves adapters of "
                          f"rank at most {VLLM_LORA_RANK_MAX}")


def check_api_key(key: str, name: str) -> None:
    """A bearer key an HTTP header can carry: printable ASCII, no spaces (the key is never echoed)."""
    if not key.strip():
        raise ConfigError(f"{name} is empty; give a key or null for none")
    bad = next((c for c in key if not "!" <= c <= "~"), None)
    if bad is not None:
        raise ConfigError(f"{name} holds {bad!r} (character {key.index(bad) + 1}): a key travels in an HTTP "
                          "header, so it may hold only printable ASCII characters without spaces")


def check_url(url: str, name: str) -> None:
    """An http(s) URL with a host (and nothing after the base path but a trailing slash)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as err:
        raise ConfigError(f"{name}={shown(url)} is not a URL ({err}); give e.g. http://127.0.0.1:8000") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{name}={shown(url)} must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8000")
    if parts.query or parts.fragment:
        raise ConfigError(f"{name}={shown(url)}: give the server's base URL, without ?query or #fragment")
    if port == 0:
        raise ConfigError(f"{name}={shown(url)}: port 0 is not a server's port")


# ---------------------------------------------------------------------------- runtime
def check_runtime(cfg: Config) -> None:
    """Every runtime check that needs no cluster, one line each; a role whose world_size is left
    at 1 takes one worker per GPU of its device_mapping (ROLL's reading)."""
    rt = cfg.runtime
    roles = {"actor_train": rt.actor_train, "actor_infer": rt.actor_infer, "reference": rt.reference,
             "critic": rt.critic}
    for name, role in roles.items():
        if role.world_size == 1 and len(role.device_mapping) > 1:
            role.world_size = len(role.device_mapping)
        _check_role(f"runtime.{name}", role)
    if rt.kind == "local":
        _check_local(cfg)
        return
    if rt.address is not None:
        check_address(rt.address)
    for name in ("reference", "critic"):
        if roles[name].world_size != 1:
            raise ConfigError(f"runtime.{name}.world_size={roles[name].world_size}: the {name} runs as one "
                              "actor; set it to 1")
    groups = cfg.rollout.groups_per_step
    if rt.env_managers > groups:
        raise ConfigError(f"runtime.env_managers={rt.env_managers} but a step has {groups} groups "
                          f"(rollout.batch_size / rollout.group_size): at most {groups} env managers get work")
    n = rt.actor_train.world_size
    if cfg.actor.ppo_mini_batch_size < n:
        raise ConfigError(f"runtime.actor_train.world_size={n} splits each mini-batch between {n} ranks, but "
                          f"actor.ppo_mini_batch_size={cfg.actor.ppo_mini_batch_size} has fewer rows; raise it "
                          f"to at least {n}")
    # Combinations the Ray runtime does not place yet: refused by name rather than run differently.
    if cfg.engine.kind in SERVED_ENGINE_KINDS:
        _check_served_on_ray(cfg)
    on_gpu = [name for name, role in roles.items() if role.device_mapping]
    if cfg.device == "cuda" and "actor_train" not in on_gpu:
        raise ConfigError("device=cuda with runtime.kind=ray: Ray places models on GPUs by device_mapping; set "
                          "runtime.actor_train.device_mapping (and actor_infer's), e.g. [0]")
    if cfg.device == "cpu" and on_gpu:
        raise ConfigError(f"device=cpu but runtime.{on_gpu[0]}.device_mapping places it on GPUs; use device=auto")
    if rt.weight_sync == "nccl":
        train, infer = set(rt.actor_train.device_mapping[:1]), set(rt.actor_infer.device_mapping)
        if not train or not infer:
            raise ConfigError("runtime.weight_sync=nccl broadcasts between GPUs: set "
                              "runtime.actor_train.device_mapping and runtime.actor_infer.device_mapping "
                              "(or weight_sync=auto)")
        if train & infer:
            raise ConfigError(f"runtime.weight_sync=nccl needs the engines on other GPUs than trainer rank 0 "
                              f"(GPU {sorted(train)[0]} is in runtime.actor_infer.device_mapping); NCCL cannot "
                              "broadcast between processes on one GPU: use weight_sync=auto")


def _check_served_on_ray(cfg: Config) -> None:
    """engine.kind=remote or vllm on Ray (runtime/ray/served.py): what the servers replace, one line each."""
    e, rt = cfg.engine, cfg.runtime
    kind = f"engine.kind={e.kind}"
    if e.urls and rt.actor_infer != RoleConfig():
        raise ConfigError(f"runtime.actor_infer is set but {kind} generates on engine.urls: a Ray run places no "
                          "engine replica of its own then; drop the runtime.actor_infer settings")
    if rt.weight_sync != "auto":
        how = "over HTTP (engine.weights_dir or the request body)" if e.kind == "remote" else \
            "through vLLM's weight transfer (engine.vllm.weight_transfer)"
        raise ConfigError(f"runtime.weight_sync={rt.weight_sync} with {kind}: weights reach the servers {how}, not "
                          "by runtime.weight_sync; leave it at auto")
    if e.kind != "vllm" or e.urls:
        return
    if cfg.rollout.max_staleness:  # built for served engines (engine.kind=remote), not tried on vLLM replicas
        raise ConfigError(f"rollout.max_staleness={cfg.rollout.max_staleness} with {kind} and runtime.kind=ray: "
                          "asynchronous rollout on Ray's own vLLM replicas is not built yet; use "
                          "rollout.max_staleness=0, engine.kind=local, or vLLM servers of your own in engine.urls")
    if e.vllm.replicas != 1:
        raise ConfigError(f"engine.vllm.replicas={e.vllm.replicas} with runtime.kind=ray: Ray starts one vLLM server "
                          f"per engine replica; set runtime.actor_infer.world_size={e.vllm.replicas} instead")
    if e.vllm.weight_transfer == "nccl":
        train, infer = set(rt.actor_train.device_mapping[:1]), set(rt.actor_infer.device_mapping)
        if not train or not infer or train & infer:
            raise ConfigError("engine.vllm.weight_transfer=nccl broadcasts from trainer rank 0's GPU into the vLLM "
                              "servers' GPUs: set runtime.actor_train.device_mapping and runtime.actor_infer."
                              "device_mapping to distinct GPUs (or engine.vllm.weight_transfer=file)")


def check_address(address: str) -> None:
    """runtime.address has a form Ray joins: auto, HOST:PORT or ray://HOST[:PORT] (one line otherwise)."""
    if address == "auto":
        return
    m = ADDRESS_FORM.fullmatch(address)
    port = m and m["port"]
    if not m or not (port or m["client"]) or port and not 1 <= int(port) <= 65535:
        raise ConfigError(f"runtime.address={shown(address)} is not a Ray cluster address; give auto, HOST:PORT (the "
                          "head's GCS, e.g. 10.0.0.1:6379) or ray://HOST:PORT (Ray client, e.g. ray://head:10001), or "
                          "null to start a local cluster")


def _check_role(key: str, role: RoleConfig) -> None:
    # world_size and the GPU indices were bounded by check_limits; a world_size derived from
    # device_mapping stays within it since indices are bounded and distinct.
    mapping = role.device_mapping
    if len(set(mapping)) != len(mapping):
        raise ConfigError(f"{key}.device_mapping={mapping} names a GPU twice; each worker takes one GPU")
    if mapping and len(mapping) != role.world_size:
        raise ConfigError(f"{key}.device_mapping={mapping} has {len(mapping)} GPUs for world_size="
                          f"{role.world_size}; give one GPU per worker")


def _check_local(cfg: Config) -> None:
    """runtime.kind=local ignores nothing silently: placement fields need kind=ray."""
    rt, default = cfg.runtime, RuntimeConfig()
    for key in ("address", "num_cpus", "num_gpus", "actor_train", "actor_infer", "reference", "critic",
                "env_managers", "env_manager_num_cpus", "weight_sync", "engine_transport", "temp_dir"):
        if getattr(rt, key) != getattr(default, key):
            raise ConfigError(f"runtime.{key} is set but runtime.kind=local runs every part in this process; "
                              "add runtime.kind=ray to place the run on Ray")
