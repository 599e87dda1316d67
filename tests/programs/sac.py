"""Soft actor-critic in the shape of CleanRL's ``sac_continuous_action.py``: a replay buffer,
two soft Q networks and their target copies (updated by hand, ``target.data.copy_(tau * p +
(1 - tau) * target)``), a squashed Gaussian actor with its action scale in buffers, and
**three** Adam optimizers made in CleanRL's order: the Q networks' (both networks' parameters
in one list), the actor's, and the entropy temperature's over a bare tensor
(``log_alpha = torch.zeros(1, requires_grad=True)``, no module holds it, and it starts at
0). Random actions until ``learning_starts``; then each step a Q update, and every
``policy_frequency`` steps that many actor and temperature updates in a row (the actor's
``backward()`` also fills the Q networks' gradients, which their next ``zero_grad()``
throws away).

The losses: the Q loss follows the returns; the actor's is ``alpha * log_pi - min Q`` (it
falls below 0 as Q grows); the temperature's is ``-alpha * (log_pi + target_entropy)``, of
either sign.

The environment: a point on a line at ``x`` steers towards a target ``g`` (both in
[-1, 1]); an action in [-1, 1] moves it by ``0.1 * a``; the reward is ``-|g - x|``;
episodes end after 16 steps.

The reference: per optimizer step (optimizer 0: Q, 1: actor, 2: temperature), the loss and
the gradient norm of that optimizer's parameters.

argv: OUT_DIR [TOTAL_STEPS]
"""

import os
import sys

import torch
import torch.nn.functional as F
import zoolib
from torch import nn

out_dir = sys.argv[1]
total_timesteps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
learning_starts, batch_size, buffer_size = 64, 32, 1000
gamma, tau, policy_lr, q_lr = 0.99, 0.005, 3e-4, 1e-3
policy_frequency, target_network_frequency = 2, 1
episode_len, LOG_STD_MAX, LOG_STD_MIN = 16, 2, -5
torch.manual_seed(4)
gen = torch.Generator().manual_seed(4)


class PointEnv:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> torch.Tensor:
        self.x, self.g, self.t = torch.rand(1, generator=gen) * 2 - 1, torch.rand(1, generator=gen) * 2 - 1, 0
        return self.obs()

    def obs(self) -> torch.Tensor:
        return torch.cat([self.x, self.g - self.x])

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, float, bool]:
        self.x = (self.x + 0.1 * action.clamp(-1, 1)).clamp(-1, 1)
        self.t += 1
        return self.obs(), -float((self.g - self.x).abs()), self.t >= episode_len


class SoftQNetwork(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 64)
        self.fc2 = nn.Linear(64, 64)
        self.fc3 = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        x = torch.cat([x, a], 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class Actor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(2, 64)
        self.fc2 = nn.Linear(64, 64)
        self.fc_mean = nn.Linear(64, 1)
        self.fc_logstd = nn.Linear(64, 1)
        self.register_buffer("action_scale", torch.tensor([1.0]))
        self.register_buffer("action_bias", torch.tensor([0.0]))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.relu(self.fc2(F.relu(self.fc1(x))))
        mean, log_std = self.fc_mean(x), torch.tanh(self.fc_logstd(x))
        return mean, LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)

    def get_action(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mean, log_std = self(x)
        std = log_std.exp()
        x_t = mean + std * torch.randn(mean.shape, generator=gen)  # rsample, with our generator
        y_t = torch.tanh(x_t)
        action = y_t * self.action_scale + self.action_bias
        log_prob = torch.distributions.Normal(mean, std).log_prob(x_t)
        log_prob = log_prob - torch.log(self.action_scale * (1 - y_t.pow(2)) + 1e-6)
        return action, log_prob.sum(1, keepdim=True), torch.tanh(mean) * self.action_scale + self.action_bias


env = PointEnv()
actor = Actor()
qf1, qf2, qf1_target, qf2_target = SoftQNetwork(), SoftQNetwork(), SoftQNetwork(), SoftQNetwork()
qf1_target.load_state_dict(qf1.state_dict())
qf2_target.load_state_dict(qf2.state_dict())
q_optimizer = torch.optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=q_lr)
actor_optimizer = torch.optim.Adam(list(actor.parameters()), lr=policy_lr)
target_entropy = -1.0
log_alpha = torch.zeros(1, requires_grad=True)
alpha = log_alpha.exp().item()
a_optimizer = torch.optim.Adam([log_alpha], lr=q_lr)
ref = zoolib.Reference(optimizers=3)
mons = []
if zoolib.watching():
    import sentinel

    mons = [sentinel.watch(qf1, q_optimizer), sentinel.watch(actor, actor_optimizer),
            sentinel.watch(None, a_optimizer)]

obs_buf, act_buf = torch.zeros(buffer_size, 2), torch.zeros(buffer_size, 1)
rew_buf, next_buf, done_buf = torch.zeros(buffer_size), torch.zeros(buffer_size, 2), torch.zeros(buffer_size)
obs, returns, episode_return = env.reset(), [], 0.0
for global_step in range(total_timesteps):
    if global_step < learning_starts:
        action = torch.rand(1, generator=gen) * 2 - 1
    else:
        with torch.no_grad():
            action = actor.get_action(obs.unsqueeze(0))[0][0]
    next_obs, reward, done = env.step(action)
    i = global_step % buffer_size
    obs_buf[i], act_buf[i], rew_buf[i], next_buf[i], done_buf[i] = obs, action, reward, next_obs, float(done)
    episode_return += reward
    obs = next_obs
    if done:
        returns.append(episode_return)
        obs, episode_return = env.reset(), 0.0

    if global_step > learning_starts:
        idx = torch.randint(0, min(global_step + 1, buffer_size), (batch_size,), generator=gen)
        b_obs, b_act, b_rew, b_next, b_done = obs_buf[idx], act_buf[idx], rew_buf[idx], next_buf[idx], done_buf[idx]
        with torch.no_grad():
            next_state_actions, next_state_log_pi, _ = actor.get_action(b_next)
            qf1_next_target = qf1_target(b_next, next_state_actions)
            qf2_next_target = qf2_target(b_next, next_state_actions)
            min_qf_next_target = torch.min(qf1_next_target, qf2_next_target) - alpha * next_state_log_pi
            next_q_value = b_rew.flatten() + (1 - b_done.flatten()) * gamma * min_qf_next_target.view(-1)
        qf1_a_values = qf1(b_obs, b_act).view(-1)
        qf2_a_values = qf2(b_obs, b_act).view(-1)
        qf1_loss = F.mse_loss(qf1_a_values, next_q_value)
        qf2_loss = F.mse_loss(qf2_a_values, next_q_value)
        qf_loss = qf1_loss + qf2_loss
        q_optimizer.zero_grad()
        qf_loss.backward()
        ref.step(qf_loss, zoolib.total_norm(list(qf1.parameters()) + list(qf2.parameters())), optimizer=0)
        q_optimizer.step()
        if mons:
            mons[0].log(loss=qf_loss)

        if global_step % policy_frequency == 0:
            for _ in range(policy_frequency):
                pi, log_pi, _ = actor.get_action(b_obs)
                min_qf_pi = torch.min(qf1(b_obs, pi), qf2(b_obs, pi))
                actor_loss = ((alpha * log_pi) - min_qf_pi).mean()
                actor_optimizer.zero_grad()
                actor_loss.backward()
                ref.step(actor_loss, zoolib.total_norm(actor.parameters()), optimizer=1)
                actor_optimizer.step()
                if mons:
                    mons[1].log(loss=actor_loss)

                with torch.no_grad():
                    _, log_pi, _ = actor.get_action(b_obs)
                alpha_loss = (-log_alpha.exp() * (log_pi + target_entropy)).mean()
                a_optimizer.zero_grad()
                alpha_loss.backward()
                ref.step(alpha_loss, zoolib.total_norm([log_alpha]), optimizer=2)
                a_optimizer.step()
                if mons:
                    mons[2].log(alpha_loss=alpha_loss)  # CleanRL's "losses/alpha_loss"
                alpha = log_alpha.exp().item()

        if global_step % target_network_frequency == 0:
            for param, target_param in zip(qf1.parameters(), qf1_target.parameters()):
                target_param.data.copy_(tau * param.data + (1 - tau) * target_param.data)
            for param, target_param in zip(qf2.parameters(), qf2_target.parameters()):
                target_param.data.copy_(tau * param.data + (1 - tau) * target_param.data)

        if global_step % 20 == 0:
            print(f"step {global_step} qf_loss {qf_loss.item()!r} actor_loss {actor_loss.item()!r} "
                  f"alpha {alpha!r} returns {returns[-3:]!r}")

os.makedirs(out_dir, exist_ok=True)
torch.save({"actor": actor.state_dict(), "qf1": qf1.state_dict(), "qf2": qf2.state_dict(),
            "log_alpha": log_alpha.detach()}, os.path.join(out_dir, "sac.pt"))
ref.saved_file(os.path.join(out_dir, "sac.pt"))
for mon in mons:
    mon.close()
ref.finish(actor, qf1, qf2)
