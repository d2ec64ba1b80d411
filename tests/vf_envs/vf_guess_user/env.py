"""vf_guess_user's env: a scripted user simulator. The env plays the user over the assistant's interaction:
after each guess it answers "higher", "lower" or "correct", for at most `max_user_turns` answers."""

import verifiers.v1 as vf

from vf_guess_user.taskset import guess


class GuessEnvConfig(vf.EnvConfig):
    assistant: vf.AgentConfig = vf.AgentConfig()
    max_user_turns: int = 2


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        secret = task.data.secret
        async with agents.assistant.interaction(task) as chat:
            reply = await chat.turn()
            for _ in range(self.config.max_user_turns):
                if reply.terminated:
                    return
                said = guess(reply.last_reply)
                if said == secret:
                    await chat.turn("correct")
                    return
                reply = await chat.turn("higher" if said is None or said < secret else "lower")
