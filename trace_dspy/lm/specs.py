"""Which language model runs what: the LM configuration and its builders.

One spec per role. ``default`` runs every stage unless a stage (or the
``analysis`` / ``response`` group) has its own; ``judge`` scores replies for the
metric; ``prompt`` is the LM that optimizers use to propose or reflect on
instructions. A spec's ``model`` is either ``local`` (the embedded
SmolLM2-135M), ``local:/path/to/model.gguf``, either with a LoRA adapter
(``local::lora=/path/to/adapter.gguf``, see ``trace_dspy.lm.local_settings``),
or any model string that ``dspy.LM`` accepts (``openai/gpt-4o-mini``,
``ollama_chat/llama3.2``, ``hosted_vllm/...``).

API keys never live in a config: a provider reads its usual environment
variable (``OPENAI_API_KEY`` ...), or ``api_key_env`` names the variable to
read. ``to_dict`` is safe to record anywhere.

TOML layout::

    [lm]                      # the default for every stage
    model = "local"
    temperature = 0.0

    [lm.stages.response]      # a group (analysis, response) or a stage name
    model = "openai/gpt-4o-mini"

    [lm.judge]
    model = "local"

    [lm.prompt]
    model = "openai/gpt-4o"
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import dspy

from trace_dspy.core.config import STAGES, ConfigError
from trace_dspy.core.safety import (
    redact_exception,
    register_secret_name,
    register_url_credentials,
)
from trace_dspy.core.stages import STAGE_GROUPS
from trace_dspy.lm.constraint import CONSTRAINT_KWARG, METADATA_KEY
from trace_dspy.lm.local_settings import check_local as _check_local
from trace_dspy.lm.local_settings import is_local_model, local_model_string, parse_local_model
from trace_dspy.lm.local_settings import is_number as _is_number
from trace_dspy.lm.threads import DEFAULT_POLICY

ROLES = ("judge", "prompt")
_SECRET_KEYS = {"api_key", "key", "token", "password", "secret"}

# Bounds on how long one LM call may run, wherever a spec comes from (a config file, flags, the serving
# environment, an artifact's manifest): DSPy tries a request num_retries + 1 times, each up to timeout
# seconds, with waits of at most 60 s between tries.
MAX_RETRIES = 10
MAX_TIMEOUT = 600.0
MAX_API_BASE_CHARS = 2048
MAX_MODEL_CHARS = 4096
def _check_spec_values(spec: LMSpec) -> None:
    """Refuse settings of the wrong type or out of bounds; the message names the field and the bound."""
    if not isinstance(spec.model, str) or not spec.model.strip() or len(spec.model) > MAX_MODEL_CHARS:
        raise ConfigError(f"lm model must be a non-empty string of at most {MAX_MODEL_CHARS} characters")
    if not _is_number(spec.num_retries, int) or not 0 <= spec.num_retries <= MAX_RETRIES:
        raise ConfigError(f"num_retries must be an integer from 0 to {MAX_RETRIES}, found {spec.num_retries!r:.40}")
    if not _is_number(spec.timeout) or not 0 < spec.timeout <= MAX_TIMEOUT:
        raise ConfigError(f"timeout must be a number of seconds, timeout > 0 and at most {MAX_TIMEOUT:g}, "
                          f"found {spec.timeout!r:.40}")
    if spec.api_base is not None and (not isinstance(spec.api_base, str) or len(spec.api_base) > MAX_API_BASE_CHARS
                                      or not spec.api_base.strip()):
        raise ConfigError(f"api_base must be a URL of at most {MAX_API_BASE_CHARS} characters"
                          + ("" if isinstance(spec.api_base, str) else f", found {type(spec.api_base).__name__}"))
    if not _is_number(spec.temperature) or not 0 <= spec.temperature <= 2:
        raise ConfigError(f"temperature must be a number from 0 to 2, found {spec.temperature!r:.40}")
    if spec.max_tokens is not None and (not _is_number(spec.max_tokens, int)
                                        or not 1 <= spec.max_tokens <= 1_000_000):
        raise ConfigError(f"max_tokens must be an integer from 1 to 1000000, found {spec.max_tokens!r:.40}")
    if spec.api_key_env is not None and (not isinstance(spec.api_key_env, str) or len(spec.api_key_env) > 256):
        raise ConfigError("api_key_env must be the name of an environment variable (at most 256 characters)")
    for key in ("cache", "server_grammar"):
        if not isinstance(getattr(spec, key), bool):
            raise ConfigError(f"{key} must be true or false, found {getattr(spec, key)!r:.40}")
    _check_local(spec.local)


@dataclass(frozen=True)
class LMSpec:
    """How to build one ``dspy.LM``. Holds no secrets."""

    model: str = "local"
    api_base: str | None = None
    api_key_env: str | None = None
    temperature: float = 0.0
    max_tokens: int | None = None
    num_retries: int = 3
    # Seconds for one request; DSPy retries a timed-out request num_retries times, so a
    # server that hangs is given up on after about (num_retries + 1) * timeout + backoff.
    timeout: float = 60.0
    cache: bool = True
    # Send a GBNF grammar for the expected reply layout with each request; only
    # servers built on llama.cpp accept it (python -m llama_cpp.server, llama-server).
    server_grammar: bool = False
    # Settings for the embedded engine (n_ctx, n_threads, seed, constrained, prefix_cache).
    local: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_spec_values(self)
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError("lm model must be a non-empty string")
        if self.api_key_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env):
            raise ConfigError(
                f"api_key_env must be the NAME of an environment variable, not {self.api_key_env[:4]!r}..."
            )
        if self.is_local:  # a malformed adapter form, or two different adapters, are refused with the config
            adapter = parse_local_model(self.model)[1]
            if adapter is not None and self.local.get("adapter") not in (None, adapter):
                raise ConfigError(f"the model string names the adapter {adapter!r:.200} and local.adapter another "
                                  f"({self.local['adapter']!r:.200}); name it once")
        if self.is_local and "thread_policy" not in self.local:  # recorded with the spec, chosen or not
            object.__setattr__(self, "local", {**self.local, "thread_policy": DEFAULT_POLICY})
        # The variable this spec reads its key from, and a password in its URL, are masked in every
        # message, row and trace from now on, whatever the variable is called.
        register_secret_name(self.api_key_env)
        register_url_credentials(self.api_base)

    @property
    def is_local(self) -> bool:
        return is_local_model(self.model)

    def to_dict(self) -> dict[str, Any]:
        """Everything needed to rebuild the LM; never a key (URL credentials are masked)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["api_base"] = redact_url(self.api_base)
        out["local"] = dict(self.local)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "lm") -> LMSpec:
        if not isinstance(data, dict):
            raise ConfigError(f"[{where}] expected a table, found {type(data).__name__}")
        data = dict(data)
        secret = _SECRET_KEYS & {k.lower() for k in data}
        if secret:
            raise ConfigError(
                f"[{where}] must not hold secrets ({', '.join(sorted(secret))}); put the key in an environment "
                "variable and name it with api_key_env"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"[{where}] unknown keys: {', '.join(unknown)}")
        try:
            return cls(**data)
        except ConfigError as exc:
            raise ConfigError(f"[{where}] {exc}") from None
        except TypeError as exc:
            raise ConfigError(f"[{where}] {exc}") from None


def redact_url(url: str | None) -> str | None:
    """Mask user:password in a URL so that it can be logged."""
    if not url:
        return url
    parts = urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        return urlunsplit((parts.scheme, f"***@{host}", parts.path, parts.query, parts.fragment))
    return url


@dataclass(frozen=True)
class LMConfig:
    """The LM for every role: a default, per-stage overrides, a judge and a prompt LM."""

    default: LMSpec = field(default_factory=LMSpec)
    stages: dict[str, LMSpec] = field(default_factory=dict)
    judge: LMSpec | None = None
    prompt: LMSpec | None = None

    def __post_init__(self) -> None:
        bad = [k for k in self.stages if k not in STAGES and k not in STAGE_GROUPS]
        if bad:
            raise ConfigError(
                f"[lm.stages] unknown stage(s) {', '.join(bad)}; use a stage name "
                f"({', '.join(STAGES)}) or a group ({', '.join(STAGE_GROUPS)})"
            )

    def for_stage(self, stage: str) -> LMSpec:
        """A stage's own spec wins over its group's, which wins over the default."""
        if stage in self.stages:
            return self.stages[stage]
        for group, members in STAGE_GROUPS.items():
            if stage in members and group in self.stages:
                return self.stages[group]
        return self.default

    def for_role(self, role: str) -> LMSpec:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        return getattr(self, role) or self.default

    def specs(self) -> list[tuple[str, LMSpec]]:
        """(role, spec) for every spec this config holds."""
        out = [("default", self.default), *((f"stages.{k}", v) for k, v in self.stages.items())]
        return out + [(r, getattr(self, r)) for r in ROLES if getattr(self, r) is not None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "default": self.default.to_dict(),
            "stages": {k: v.to_dict() for k, v in self.stages.items()},
            "judge": self.judge.to_dict() if self.judge else None,
            "prompt": self.prompt.to_dict() if self.prompt else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> LMConfig:
        """Read the ``[lm]`` table (or a ``to_dict`` record)."""
        if data is not None and not isinstance(data, dict):
            raise ConfigError(f"[lm] expected a table, found {type(data).__name__}")
        if not isinstance((data or {}).get("stages") or {}, dict):
            raise ConfigError(f"[lm.stages] expected a table, found {type(data['stages']).__name__}")
        data = dict(data or {})
        if "default" in data:  # a to_dict record
            default = LMSpec.from_dict(data.pop("default") or {}, where="lm")
        else:
            default = LMSpec.from_dict({k: v for k, v in data.items() if k not in ("stages", *ROLES)}, where="lm")
        stages = {k: LMSpec.from_dict(v, where=f"lm.stages.{k}") for k, v in (data.get("stages") or {}).items()}
        roles = {r: LMSpec.from_dict(data[r], where=f"lm.{r}") if data.get(r) else None for r in ROLES}
        return cls(default=default, stages=stages, **roles)

    def with_timeout(self, seconds: float) -> LMConfig:
        """The same config with every spec's request timeout set to ``seconds``."""
        def set_(spec: LMSpec | None) -> LMSpec | None:
            return replace(spec, timeout=seconds) if spec is not None else None

        return LMConfig(default=set_(self.default), stages={k: set_(v) for k, v in self.stages.items()},
                        judge=set_(self.judge), prompt=set_(self.prompt))

    def with_overrides(
        self,
        *,
        lm: str | None = None,
        api_base: str | None = None,
        api_key_env: str | None = None,
        analysis_lm: str | None = None,
        response_lm: str | None = None,
        judge_lm: str | None = None,
        prompt_lm: str | None = None,
    ) -> LMConfig:
        """Apply command-line flags on top of the file config."""
        conn = {k: v for k, v in (("api_base", api_base), ("api_key_env", api_key_env)) if v is not None}
        default = replace(self.default, **({"model": lm} if lm else {}), **conn)
        stages = dict(self.stages)
        for group, model in (("analysis", analysis_lm), ("response", response_lm)):
            if model:
                stages[group] = replace(stages.get(group, default), model=model)
        judge = replace(self.judge or default, model=judge_lm) if judge_lm else self.judge
        prompt = replace(self.prompt or default, model=prompt_lm) if prompt_lm else self.prompt
        return LMConfig(default=default, stages=stages, judge=judge, prompt=prompt)


# Set while a failed row is asked again: its LM calls skip DSPy's cache, so that
# a failed or garbage reply stored by the first attempt is not replayed.
_FRESH: contextvars.ContextVar[bool] = contextvars.ContextVar("trace_dspy_fresh_calls", default=False)


@contextlib.contextmanager
def fresh_calls():
    """LM calls made inside (in this thread or task) bypass DSPy's response cache."""
    token = _FRESH.set(True)
    try:
        yield
    finally:
        _FRESH.reset(token)


def use_lm(lm: dspy.LM | None):
    """``dspy.context(lm=lm)``, or a context that changes nothing when ``lm`` is None."""
    return dspy.context(lm=lm) if lm is not None else contextlib.nullcontext()


def endpoint_rollout(endpoint: str, rollout_id: Any = None) -> int:
    """A rollout id that folds the endpoint into DSPy's cache key.

    DSPy leaves ``api_base`` out of its cache key, so two servers behind the
    same model name would share answers. ``rollout_id`` is part of the key and
    never sent to the server; it carries the endpoint (and any rollout id a
    caller such as ``dspy.BestOfN`` set).
    """
    digest = hashlib.sha256(f"{endpoint}\n{rollout_id!r}".encode()).digest()
    return int.from_bytes(digest[:6], "big")


class TraceLM(dspy.LM):
    """``dspy.LM`` whose cache key includes the endpoint, and which honours :func:`fresh_calls`.

    It takes the ``output_constraint`` keyword (``trace_dspy.lm.constraint``) that this project's adapters
    pass: an engine that decodes under it (``takes_output_constraint``) gets it in the request's metadata,
    which is also part of DSPy's cache key; any other engine never sees it.
    """

    takes_output_constraint = True

    def __init__(self, *args, endpoint: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.endpoint = endpoint
        # The endpoint's rollout id is a cache key, not a sampling request: no warning at temperature 0.
        self._warned_zero_temp_rollout = True

    def _call_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs = dict(kwargs)
        constraint = kwargs.pop(CONSTRAINT_KWARG, None)
        if constraint is not None and getattr(getattr(self, "engine", None), "takes_output_constraint", False):
            kwargs["metadata"] = {**(kwargs.get("metadata") or {}), METADATA_KEY: constraint.to_json()}
        if _FRESH.get():
            kwargs["cache"] = False
        if self.endpoint:
            kwargs["rollout_id"] = endpoint_rollout(self.endpoint, kwargs.get("rollout_id",
                                                                              self.kwargs.get("rollout_id")))
        return kwargs

    def copy(self, **kwargs):
        """A copy with ``kwargs`` changed. A new embedded-model string (``local:...``, which a fine-tune returns
        to ``dspy.LM.finetune``) gets its own engine, with this one's settings, and the name that goes with it."""
        model, engine = kwargs.get("model"), getattr(self, "engine", None)
        if is_local_model(model) and model != self.model and hasattr(engine, "settings"):
            base, adapter = parse_local_model(model)
            fresh = local_lm(cache=self.cache, **{**engine.settings(), "model_path": base, "adapter": adapter})
            kwargs.update(model=fresh.model, engine=fresh.engine, finetuning_model=fresh.finetuning_model)
        return super().copy(**kwargs)

    # An error that leaves the LM has its credentials masked (a provider's 401 may quote the key), so
    # that every recorder after it (traces, logs, error rows) sees the masked text.
    def __call__(self, prompt=None, messages=None, **kwargs):
        try:
            return super().__call__(prompt=prompt, messages=messages, **self._call_kwargs(kwargs))
        except Exception as exc:
            redact_exception(exc)
            raise

    async def acall(self, prompt=None, messages=None, **kwargs):
        try:
            return await super().acall(prompt=prompt, messages=messages, **self._call_kwargs(kwargs))
        except Exception as exc:
            redact_exception(exc)
            raise


class GrammarLM(TraceLM):
    """A ``dspy.LM`` that sends a GBNF grammar for the expected reply layout.

    For OpenAI-compatible servers built on llama.cpp, which accept ``grammar``
    in the request body: the same constrained decoding as the embedded engine.
    """

    def __call__(self, prompt=None, messages=None, **kwargs):
        return super().__call__(prompt=prompt, messages=messages, **self._with_grammar(messages, kwargs))

    async def acall(self, prompt=None, messages=None, **kwargs):
        return await super().acall(prompt=prompt, messages=messages, **self._with_grammar(messages, kwargs))

    @staticmethod
    def _with_grammar(messages, kwargs):
        """The call's keywords with the grammar of its output constraint (the one passed with the call, else
        the one its rendered prompt asks for) in the request body."""
        from trace_dspy.lm.grammar import grammar_for_call, prompt_constraint

        kwargs = dict(kwargs)
        constraint = kwargs.pop(CONSTRAINT_KWARG, None)
        if constraint is None and messages and isinstance(messages[0], dict) and messages[0].get("role") == "system":
            last = messages[-1] if isinstance(messages[-1], dict) and messages[-1].get("role") == "user" else {}
            constraint = prompt_constraint(str(messages[0].get("content", "")), str(last.get("content", "")))
        grammar = grammar_for_call(constraint)
        if grammar:
            kwargs["extra_body"] = {**kwargs.get("extra_body", {}), "grammar": grammar}
        return kwargs


def offline_litellm() -> None:
    """Keep LiteLLM from fetching its model price list over the network."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def local_lm(model_path: str | None = None, *, cache: bool = True, name: str | None = None,
             **engine_kwargs) -> Any:
    """A ``dspy.LM`` backed by the embedded model.

    The LM's name is part of DSPy's cache key, so it names the model file and
    the settings that change answers (constraints off, prefix reuse off).
    """

    from trace_dspy.lm.engine import SAMPLE_MIN_P, LlamaEngine
    from trace_dspy.lm.finetune.provider import EmbeddedProvider
    from trace_dspy.lm.model_files import DEFAULT_MODEL_NAME, import_llama

    import_llama()  # fail early with the install hint
    engine = LlamaEngine(model_path, **engine_kwargs)
    if name is None:
        name = DEFAULT_MODEL_NAME if model_path is None else "local/" + Path(model_path).stem.lower()
        name += "" if engine.constrained else "+unconstrained"
        name += "" if engine.prefix_cache else "+noreuse"
        name += "" if engine.loop_guard or not engine.fast_greedy else "+noguard"
        name += "" if engine.jump_forward or not engine.fast_greedy else "+nojump"
        name += "" if engine.sample_min_p == SAMPLE_MIN_P else f"+minp{engine.sample_min_p:g}"
    name += engine.adapter_tag()  # an adapted model never shares cached replies with its base
    # lm.finetune (dspy.BootstrapFinetune) trains a LoRA adapter on the base model file.
    return TraceLM(name, engine=engine, cache=cache, provider=EmbeddedProvider(),
                   finetuning_model=local_model_string(engine.model_path))


def build_lm(spec: LMSpec) -> dspy.LM:
    """Build the ``dspy.LM`` a spec describes. Keys come only from the environment."""
    if spec.is_local:
        path, adapter = parse_local_model(spec.model)
        lm = local_lm(path, cache=spec.cache, **({**spec.local, "adapter": adapter} if adapter else spec.local))
        lm.kwargs["temperature"] = spec.temperature
        if spec.max_tokens:
            lm.kwargs["max_tokens"] = spec.max_tokens
        return lm
    offline_litellm()
    kwargs: dict[str, Any] = {
        "temperature": spec.temperature,
        "num_retries": spec.num_retries,
        "cache": spec.cache,
        "timeout": spec.timeout,
    }
    if spec.max_tokens:
        kwargs["max_tokens"] = spec.max_tokens
    if spec.api_base:
        kwargs["api_base"] = spec.api_base
    if spec.api_key_env:
        register_secret_name(spec.api_key_env)
        key = os.environ.get(spec.api_key_env)
        if not key:
            raise ConfigError(f"api_key_env names {spec.api_key_env}, but that environment variable is not set")
        kwargs["api_key"] = key
    cls = GrammarLM if spec.server_grammar else TraceLM
    return cls(spec.model, endpoint=redact_url(spec.api_base), **kwargs)


class LMSet:
    """The built LMs of one configuration; identical specs share one LM object."""

    def __init__(self, config: LMConfig):
        self.config = config
        self._built: dict[str, dspy.LM] = {}

    def _get(self, spec: LMSpec) -> dspy.LM:
        key = repr(spec)
        if key not in self._built:
            self._built[key] = build_lm(spec)
        return self._built[key]

    @property
    def default(self) -> dspy.LM:
        return self._get(self.config.default)

    def stage(self, stage: str) -> dspy.LM:
        return self._get(self.config.for_stage(stage))

    def stage_lms(self) -> dict[str, dspy.LM]:
        return {s: self.stage(s) for s in STAGES}

    def role(self, role: str) -> dspy.LM:
        return self._get(self.config.for_role(role))
