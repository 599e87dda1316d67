"""A PPO loop in the shape of CleanRL's ``ppo.py`` (and the PyTorch examples'
``reinforcement_learning``): vectorised environments (here a tiny one written in torch, no
gym), an agent with a critic and an actor head under one Adam (``eps=1e-5``), a learning
rate annealed linearly to 0 per iteration, rollouts, GAE, then ``update_epochs`` passes of
shuffled minibatches over each rollout with advantages normalised per minibatch, the
clipped surrogate objective, a clipped value loss, an entropy bonus and
``clip_grad_norm_(…, 0.5)``.

The loss is ``pg_loss - ent_coef * entropy + vf_coef * v_loss``: its policy part is about 0
at each rollout's first minibatch (normalised advantages, ratio 1) and either sign after,
and the value part follows the returns, which grow as the agent gets better. Negative
losses and sign changes are healthy here.

The environment: a point on a line at ``x`` must reach a target ``g`` (both in [-1, 1]);
actions move it by -0.1, 0 or +0.1; the reward is -0.01 per step and +1 on reaching it
(which ends the episode), and episodes end after 16 steps.

The reference: per optimizer step, the minibatch's loss, the norm before clipping
(``clip_grad_norm_``'s return) and the norm after it.

argv: OUT_DIR [ITERATIONS]
"""

import os
import sys

import torch
import zoolib
from torch import nn

out_dir = sys.argv[1]
num_iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 16
num_envs, num_steps, num_minibatches, update_epochs = 8, 16, 4, 4
learning_rate, gamma, gae_lambda = 2.5e-3, 0.99, 0.95
clip_coef, ent_coef, vf_coef, max_grad_norm = 0.2, 0.01, 0.5, 0.5
batch_size = num_envs * num_steps
minibatch_size = batch_size // num_minibatches
episode_len, n_actions = 16, 3
torch.manual_seed(1)
gen = torch.Generator().manual_seed(1)  # the environment, the actions and the shuffles


class PointEnv:
    """``num_envs`` points on a line, each with its own target; auto-resets like gym's vector envs."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.x = torch.zeros(n)
        self.g = torch.zeros(n)
        self.t = torch.zeros(n, dtype=torch.long)
        self._reset(torch.ones(n, dtype=torch.bool))

    def _reset(self, mask: torch.Tensor) -> None:
        k = int(mask.sum())
        self.x[mask] = torch.rand(k, generator=gen) * 2 - 1
        self.g[mask] = torch.rand(k, generator=gen) * 2 - 1
        self.t[mask] = 0

    def obs(self) -> torch.Tensor:
        return torch.stack([self.x, self.g - self.x], dim=1)

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self.x = (self.x + 0.1 * (action.float() - 1)).clamp(-1, 1)
        self.t += 1
        dist = (self.g - self.x).abs()
        reached = dist < 0.05
        reward = reached.float() - 0.01
        done = reached | (self.t >= episode_len)
        self._reset(done)
        return self.obs(), reward, done.float()


def layer_init(layer: nn.Linear, std: float = 2 ** 0.5, bias_const: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.critic = nn.Sequential(layer_init(nn.Linear(2, 32)), nn.Tanh(), layer_init(nn.Linear(32, 32)),
                                    nn.Tanh(), layer_init(nn.Linear(32, 1), std=1.0))
        self.actor = nn.Sequential(layer_init(nn.Linear(2, 32)), nn.Tanh(), layer_init(nn.Linear(32, 32)),
                                   nn.Tanh(), layer_init(nn.Linear(32, n_actions), std=0.01))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(
        self, x: torch.Tensor, action: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.actor(x)
        probs = torch.distributions.Categorical(logits=logits)
        if action is None:  # sampled with our generator: Categorical.sample takes none
            action = torch.multinomial(probs.probs, 1, generator=gen).squeeze(1)
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


envs = PointEnv(num_envs)
agent = Agent()
optimizer = torch.optim.Adam(agent.parameters(), lr=learning_rate, eps=1e-5)
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(agent, optimizer)

obs = torch.zeros((num_steps, num_envs, 2))
actions = torch.zeros((num_steps, num_envs), dtype=torch.long)
logprobs = torch.zeros((num_steps, num_envs))
rewards = torch.zeros((num_steps, num_envs))
dones = torch.zeros((num_steps, num_envs))
values = torch.zeros((num_steps, num_envs))
next_obs, next_done = envs.obs(), torch.zeros(num_envs)

for iteration in range(1, num_iterations + 1):
    frac = 1.0 - (iteration - 1.0) / num_iterations  # annealed to 0 by the end
    optimizer.param_groups[0]["lr"] = frac * learning_rate
    for step in range(num_steps):
        obs[step], dones[step] = next_obs, next_done
        with torch.no_grad():
            action, logprob, _, value = agent.get_action_and_value(next_obs)
        values[step], actions[step], logprobs[step] = value.flatten(), action, logprob
        next_obs, rewards[step], next_done = envs.step(action)

    with torch.no_grad():  # GAE
        next_value = agent.get_value(next_obs).reshape(1, -1)
        advantages = torch.zeros_like(rewards)
        lastgaelam = torch.zeros(num_envs)
        for t in reversed(range(num_steps)):
            if t == num_steps - 1:
                nextnonterminal, nextvalues = 1.0 - next_done, next_value
            else:
                nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
            delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
            advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
        returns = advantages + values

    b_obs, b_logprobs, b_actions = obs.reshape(-1, 2), logprobs.reshape(-1), actions.reshape(-1)
    b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
    clipfracs = []
    for epoch in range(update_epochs):
        b_inds = torch.randperm(batch_size, generator=gen)
        for start in range(0, batch_size, minibatch_size):
            mb_inds = b_inds[start:start + minibatch_size]
            _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
            logratio = newlogprob - b_logprobs[mb_inds]
            ratio = logratio.exp()
            with torch.no_grad():
                approx_kl = ((ratio - 1) - logratio).mean()
                clipfracs.append(((ratio - 1.0).abs() > clip_coef).float().mean().item())
            mb_advantages = b_advantages[mb_inds]
            mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
            pg_loss1 = -mb_advantages * ratio
            pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
            pg_loss = torch.max(pg_loss1, pg_loss2).mean()
            newvalue = newvalue.view(-1)
            v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
            v_clipped = b_values[mb_inds] + torch.clamp(newvalue - b_values[mb_inds], -clip_coef, clip_coef)
            v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
            v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
            entropy_loss = entropy.mean()
            loss = pg_loss - ent_coef * entropy_loss + v_loss * vf_coef

            optimizer.zero_grad()
            loss.backward()
            preclip = nn.utils.clip_grad_norm_(agent.parameters(), max_grad_norm)
            ref.step(loss, zoolib.total_norm(agent.parameters()), preclip=float(preclip))
            optimizer.step()
            if mon is not None:
                mon.log(loss=loss)
            print(f"iter {iteration} epoch {epoch} loss {loss.item()!r} pg {pg_loss.item()!r} "
                  f"v {v_loss.item()!r} ent {entropy_loss.item()!r} kl {approx_kl.item()!r}")
    print(f"iter {iteration}: mean reward {rewards.mean().item()!r}, clipfrac {sum(clipfracs) / len(clipfracs)!r}, "
          f"lr {optimizer.param_groups[0]['lr']!r}")

os.makedirs(out_dir, exist_ok=True)
torch.save(agent.state_dict(), os.path.join(out_dir, "agent.pt"))
ref.saved_file(os.path.join(out_dir, "agent.pt"))
if mon is not None:
    mon.close()
ref.finish(agent)
