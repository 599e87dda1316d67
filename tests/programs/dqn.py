"""Deep Q-learning in the shape of the PyTorch tutorial (``reinforcement_q_learning.py``) and
its many copies: a policy network and a target network of one class, the target made from
the policy's ``state_dict``; a replay memory (a ``deque`` of ``namedtuple`` transitions,
``random.sample``); epsilon-greedy actions from the policy network under ``torch.no_grad()``
between the steps; ``SmoothL1Loss`` of the temporal-difference error; ``AdamW(amsgrad=True)``;
``clip_grad_value_(…, 100)``; and after every step a soft update of the target network
through its state dict (``target_net.load_state_dict(...)``).

The loss is no progress measure here: its targets are the target network's own estimates,
which grow as the agent survives longer (a pole kept up for 100 steps is worth about 60),
so the TD loss climbs while the agent gets better, and it jumps when the replay memory
fills with longer episodes.

The environment: Gymnasium's ``CartPole-v1``, as in the tutorial (seeded once; the
random actions from its action space). Importing Gymnasium is what tells Sentinel that the
run trains an agent (``WatchOptions.rl``).

The reference: per optimizer step, the loss and the gradient norm after the value clip.

argv: OUT_DIR [EPISODES]
"""

import math
import os
import random
import sys
from collections import deque, namedtuple
from itertools import count

import gymnasium as gym
import torch
import torch.nn.functional as F
import zoolib
from torch import nn, optim

out_dir = sys.argv[1]
num_episodes = int(sys.argv[2]) if len(sys.argv) > 2 else 50
BATCH_SIZE, GAMMA, EPS_START, EPS_END, EPS_DECAY, TAU, LR = 128, 0.99, 0.9, 0.01, 500, 0.005, 3e-4
random.seed(5)
torch.manual_seed(5)


Transition = namedtuple("Transition", ("state", "action", "next_state", "reward"))


class ReplayMemory:
    def __init__(self, capacity: int) -> None:
        self.memory: deque = deque([], maxlen=capacity)

    def push(self, *args: object) -> None:
        self.memory.append(Transition(*args))

    def sample(self, batch_size: int) -> list:
        return random.sample(self.memory, batch_size)

    def __len__(self) -> int:
        return len(self.memory)


class DQN(nn.Module):
    def __init__(self, n_observations: int, n_actions: int) -> None:
        super().__init__()
        self.layer1 = nn.Linear(n_observations, 128)
        self.layer2 = nn.Linear(128, 128)
        self.layer3 = nn.Linear(128, n_actions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.layer1(x))
        x = F.relu(self.layer2(x))
        return self.layer3(x)


env = gym.make("CartPole-v1")
env.action_space.seed(5)
state, info = env.reset(seed=5)
n_actions, n_observations = env.action_space.n, len(state)
policy_net, target_net = DQN(n_observations, n_actions), DQN(n_observations, n_actions)
target_net.load_state_dict(policy_net.state_dict())
optimizer = optim.AdamW(policy_net.parameters(), lr=LR, amsgrad=True)
memory = ReplayMemory(10000)
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(policy_net, optimizer)
steps_done = 0


def select_action(state: torch.Tensor) -> torch.Tensor:
    global steps_done
    sample = random.random()
    eps_threshold = EPS_END + (EPS_START - EPS_END) * math.exp(-1.0 * steps_done / EPS_DECAY)
    steps_done += 1
    if sample > eps_threshold:
        with torch.no_grad():
            return policy_net(state).max(1).indices.view(1, 1)
    return torch.tensor([[env.action_space.sample()]], dtype=torch.long)


def optimize_model() -> None:
    if len(memory) < BATCH_SIZE:
        return
    transitions = memory.sample(BATCH_SIZE)
    batch = Transition(*zip(*transitions))
    non_final_mask = torch.tensor(tuple(map(lambda s: s is not None, batch.next_state)), dtype=torch.bool)
    non_final_next_states = torch.cat([s for s in batch.next_state if s is not None])
    state_batch, action_batch = torch.cat(batch.state), torch.cat(batch.action)
    reward_batch = torch.cat(batch.reward)
    state_action_values = policy_net(state_batch).gather(1, action_batch)
    next_state_values = torch.zeros(BATCH_SIZE)
    with torch.no_grad():
        next_state_values[non_final_mask] = target_net(non_final_next_states).max(1).values
    expected_state_action_values = (next_state_values * GAMMA) + reward_batch
    criterion = nn.SmoothL1Loss()
    loss = criterion(state_action_values, expected_state_action_values.unsqueeze(1))
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_value_(policy_net.parameters(), 100)
    ref.step(loss, zoolib.total_norm(policy_net.parameters()))
    optimizer.step()
    if mon is not None:
        mon.log(loss=loss)


durations = []
for i_episode in range(num_episodes):
    state, info = env.reset()
    state = torch.tensor(state, dtype=torch.float32).unsqueeze(0)
    for t in count():
        action = select_action(state)
        observation, reward, terminated, truncated, _ = env.step(action.item())
        reward = torch.tensor([reward])
        next_state = None if terminated else torch.tensor(observation, dtype=torch.float32).unsqueeze(0)
        memory.push(state, action, next_state, reward)
        state = next_state
        optimize_model()
        target_net_state_dict = target_net.state_dict()
        policy_net_state_dict = policy_net.state_dict()
        for key in policy_net_state_dict:
            target_net_state_dict[key] = policy_net_state_dict[key] * TAU + target_net_state_dict[key] * (1 - TAU)
        target_net.load_state_dict(target_net_state_dict)
        if terminated or truncated:
            durations.append(t + 1)
            break
    print(f"episode {i_episode} duration {durations[-1]}")

os.makedirs(out_dir, exist_ok=True)
torch.save(policy_net.state_dict(), os.path.join(out_dir, "policy_net.pt"))
ref.saved_file(os.path.join(out_dir, "policy_net.pt"))
if mon is not None:
    mon.close()
ref.finish(policy_net)
