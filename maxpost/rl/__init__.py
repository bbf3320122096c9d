"""RL (GRPO, GSPO, DAPO, Dr.GRPO) in three modules: `config` (RLConfig and every config-time check), `rollout`
(prompts, rewards, rollout arrays, evaluation of a policy) and `trainer` (the RL step and the run).

Hand-written (nbdev exports the three modules, not this file): it re-exports their public names, so that
`from maxpost.rl import RLConfig, train` works."""
from .config import *
from .rollout import *
from .trainer import *
from . import config, rollout, trainer
