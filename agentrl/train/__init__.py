"""Training: packing, actor updates, checkpoints and the step loop.

`agentrl.train` is also the API's `train` function: this package is callable, so
`from agentrl import train; train(config, agent_cls=..., env_cls=...)` works whether or not the
package was imported before (importing a subpackage binds its name on the parent, which would
otherwise hide a function of that name). See `agentrl.api.train`.
"""

import importlib
import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        """Train (agentrl.api.train): config, agent_cls, env_cls, tokenizer, overrides=, resume=, log=."""
        return importlib.import_module("agentrl.api").train(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
