"""A multi-turn verifiers environment for agentrl's tests: guess a number from 1 to 4, told higher or lower.

The env's `run` answers each guess (verifiers 0.4.0's multi-turn: the env holds the exchange open
with `interaction()` and speaks the user's turns); the task's rewards score the whole exchange.
Imported only by verifiers' worker (`.venv-verifiers`), as `env.args.load=vf_guess:load_environment`.
"""

import verifiers.v1 as vf

MAX_GUESSES = 3


class GuessData(vf.TaskData):
    """One secret number."""

    answer: int


def guesses(trace: vf.Trace) -> list[str]:
    """The policy's replies, stripped."""
    return [(m.content or "").strip() for m in trace.assistant_messages]


class GuessTask(vf.Task[GuessData]):
    """1 when the last guess is the secret, and a bonus for guessing it early; giving up stops."""

    @vf.reward(weight=1.0)
    async def solved(self, trace: vf.Trace) -> float:
        said = guesses(trace)
        return float(bool(said) and said[-1] == str(self.data.answer))

    @vf.stop
    def gave_up(self, trace: vf.Trace) -> bool:
        """A reply that gives up ends the exchange (the env's next turn finds it over)."""
        return "give up" in trace.last_reply

    @vf.reward(weight=0.25)
    async def early(self, trace: vf.Trace) -> float:
        said = guesses(trace)
        return (MAX_GUESSES - len(said) + 1) / MAX_GUESSES if str(self.data.answer) in said else 0.0


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self) -> list[GuessTask]:
        return [GuessTask(GuessData(prompt="Guess my number from 1 to 4. Reply with the number only.",
                                    system_prompt="You play a guessing game.", answer=1 + i % 4))
                for i in range(8)]


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    """The env's side of the exchange: `higher` or `lower` after each wrong guess, up to MAX_GUESSES."""

    async def run(self, task, agents):
        async with agents.player.interaction(task) as chat:
            segment = await chat.turn()
            for _ in range(MAX_GUESSES - 1):
                said = segment.last_reply
                if segment.terminated or said == str(task.data.answer):
                    break
                hint = "higher" if not said.isdigit() or int(said) < task.data.answer else "lower"
                segment = await chat.turn(f"No: {hint}.")


class TwoSeatEnv(GuessEnv):
    """The first guess, then a second agent asked to comment on it: a seat agentrl does not play."""

    async def run(self, task, agents):
        async with agents.player.interaction(task) as chat:
            segment = await chat.turn()
        await agents.critic.run(type(task)(task.data.model_copy(update={"prompt": segment.last_reply})))


def load_two_seats() -> TwoSeatEnv:
    """An env of two agents (agentrl plays one seat: its episodes fail in one line)."""
    return TwoSeatEnv(GuessEnvConfig(taskset={"id": "vf_guess"}))


def load_environment() -> GuessEnv:
    """The env over its taskset (the taskset is this module, found by its id)."""
    return GuessEnv(GuessEnvConfig(taskset={"id": "vf_guess"}))


__all__ = ["GuessTaskset", "GuessEnv"]  # one Env: the taskset id resolves to GuessEnv
