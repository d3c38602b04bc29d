"""PPO that remembers a cue: the agent acts one step per call, and each update re-runs the rollout
in one call from the memory stored at its start, exactly as the agent acted (docs/AGENT.md).

    python -m research.ppo_cue                  # about 10 minutes on 2 idle cores
    python -m research.ppo_cue --seeds 0 1 2 --plot docs/ppo_cue.png

PPO as CleanRL writes it, rollouts of 32 steps (n_s 24: they begin and end inside segments);
printed per seed, the mean return (chance 0.25), and before each update's first optimizer step
the largest |log ratio| to the actor and fraction of samples outside the clip range."""

import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from beyond_the_paper.agent import AgentCore
from compressive import CompressiveConfig
from research import made_with, parser, plot_curves

N_CUES, BLANK, QUERY = 4, 4, 5  # the observations: a cue 0-3, a blank step, the query
ENVS, MINIBATCHES = 16, 2  # environments, split in minibatches for each pass over a rollout
ROLLOUT, EPOCHS = 32, 4  # steps acted per rollout; passes over each
MIN_DELAY, MAX_DELAY = 40, 100  # blank steps after the cue
ITERATIONS, REPORT = 300, 25  # rollouts and updates a seed; a point of its curve every REPORT


class CueEnvs:
    """n_envs environments of the cue task, stepped together on the CPU."""

    def __init__(self, n_envs: int, min_delay: int, max_delay: int, generator):
        self.min_delay, self.max_delay, self.generator = min_delay, max_delay, generator
        self.cue = torch.zeros(n_envs, dtype=torch.long)
        self.left = torch.zeros(n_envs, dtype=torch.long)  # blank steps before the query
        self.observation = torch.zeros(n_envs, dtype=torch.long)
        self.begin(torch.ones(n_envs, dtype=torch.bool))

    def begin(self, rows):
        """New episodes in rows: a cue now, the query after a delay of its own."""
        n = int(rows.sum())
        self.cue[rows] = torch.randint(0, N_CUES, (n,), generator=self.generator)
        delay = torch.randint(self.min_delay, self.max_delay + 1, (n,), generator=self.generator)
        self.left[rows] = delay
        self.observation[rows] = self.cue[rows]

    def step(self, action):
        """(reward, done) [n] each; the next observation in self.observation, a new one's first."""
        done = self.observation == QUERY
        reward = (done & (action == self.cue)).float()
        self.left -= 1
        self.observation = torch.where(self.left > 0, BLANK, QUERY)
        self.begin(done)
        return reward, done


class Agent(nn.Module):
    """An input layer, AgentCore, a head that names the cue and, for PPO, a value head."""

    def __init__(self, cfg: CompressiveConfig, observations: int = QUERY + 1, value: bool = True):
        super().__init__()
        self.observe = nn.Embedding(observations, cfg.d_model)
        self.core = AgentCore(cfg)
        self.policy = nn.Linear(cfg.d_model, N_CUES)
        self.value = nn.Linear(cfg.d_model, 1) if value else None

    def forward(self, observations, memory=None, starts=None):
        """observations, starts [B, T] -> logits [B, T, N_CUES], (values,) memory, f_c's loss."""
        h, memory, recon_loss = self.core(self.observe(observations), memory, starts)
        if self.value is None:
            return self.policy(h), memory, recon_loss
        return self.policy(h), self.value(h)[..., 0], memory, recon_loss


def supervised_step(agent, optimizer, observations, targets, memory=None, starts=None):
    """A step on the cross-entropy at the asked steps plus f_c's loss; (that loss, the memory)."""
    logits, memory, recon_loss = agent(observations, memory, starts)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
    loss = loss / targets.ne(-100).sum().clamp(min=1)
    optimizer.zero_grad()
    (loss + recon_loss).backward()
    optimizer.step()
    return loss, memory


@torch.no_grad()
def act(agent, observations, starts):
    """The agent acting one step per call, its memory carried: logits [B, T, N_CUES]."""
    memory, logits = None, []
    for t in range(observations.size(1)):
        step_logits, memory, _ = agent(observations[:, t : t + 1], memory, starts[:, t : t + 1])
        logits.append(step_logits)
    return torch.cat(logits, dim=1)


def gae(rewards, values, dones, next_value, gamma: float = 0.99, lam: float = 0.95):
    """GAE [B, T] of rewards, values, dones [B, T] (1.0: an episode's end), next_value [B]."""
    advantages, last = torch.zeros_like(rewards), torch.zeros_like(next_value)
    for t in reversed(range(rewards.size(1))):
        following = next_value if t == rewards.size(1) - 1 else values[:, t + 1]
        delta = rewards[:, t] + gamma * following * (1 - dones[:, t]) - values[:, t]
        last = delta + gamma * lam * (1 - dones[:, t]) * last
        advantages[:, t] = last
    return advantages


def train(seed: int):
    """One seed of PPO: the curve [(iteration, mean return since the last report, episodes)] and,
    for each update before its first step, (max |log ratio|, the fraction outside the clip)."""
    torch.manual_seed(seed)
    # n_m = 48 memories and n_cm = 24 compressed ones of c = 4 (the default): the query reaches
    # 144 steps and more before its segment, the cue 41 to 101 steps back
    cfg = CompressiveConfig(
        d_model=32, n_heads=2, n_layers=2, d_ff=64, seq_len=24, mem_len=48, c_mem_len=24
    )
    agent = Agent(cfg)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-3, eps=1e-5)
    envs = CueEnvs(ENVS, MIN_DELAY, MAX_DELAY, torch.Generator().manual_seed(seed))
    clip, B, T = 0.2, ENVS, ROLLOUT
    memory, start = agent.core.empty_memory(B), torch.ones(B, dtype=torch.bool)
    curve, exactness, returns = [], [], []
    for iteration in range(1, ITERATIONS + 1):
        # act: one step per call, the memory carried; the update starts from this memory
        at_start = memory
        observations, actions = torch.zeros(2, B, T, dtype=torch.long)
        starts = torch.zeros(B, T, dtype=torch.bool)
        logprobs, values, rewards, dones = torch.zeros(4, B, T)
        agent.eval()
        with torch.no_grad():
            for t in range(T):
                observations[:, t], starts[:, t] = envs.observation, start
                logits, value, memory, _ = agent(envs.observation[:, None], memory, start[:, None])
                dist = torch.distributions.Categorical(logits=logits[:, 0])
                actions[:, t] = dist.sample()
                logprobs[:, t], values[:, t] = dist.log_prob(actions[:, t]), value[:, 0]
                rewards[:, t], done = envs.step(actions[:, t])
                dones[:, t], start = done.float(), done
                returns += rewards[done, t].tolist()
            # the value of the next observation, from the memory now (not kept)
            next_value = agent(envs.observation[:, None], memory, start[:, None])[1][:, 0]
        advantages = gae(rewards, values, dones, next_value)
        targets = advantages + values

        # update: each minibatch of environments re-runs its rollout in one call from the
        # memory stored at the rollout's start, with the rollout's starts. Before any optimizer
        # step the policy is the actor's: how far is the update's from it, over every sample?
        agent.train()
        with torch.no_grad():
            logits = agent(observations, at_start, starts)[0]
            log_ratio = torch.distributions.Categorical(logits=logits).log_prob(actions) - logprobs
            outside = ((log_ratio.exp() - 1).abs() > clip).float().mean()
            exactness.append((log_ratio.abs().max().item(), outside.item()))
        for _ in range(EPOCHS):
            for rows in torch.randperm(B).chunk(MINIBATCHES):
                logits, value, _, recon_loss = agent(
                    observations[rows], at_start.take(rows), starts[rows]
                )
                dist = torch.distributions.Categorical(logits=logits)
                log_ratio = dist.log_prob(actions[rows]) - logprobs[rows]
                ratio, adv = log_ratio.exp(), advantages[rows]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
                value_loss = 0.5 * (value - targets[rows]).square().mean()
                loss = policy_loss + 0.5 * value_loss - 0.01 * dist.entropy().mean() + recon_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                optimizer.step()
        if iteration % REPORT == 0:
            curve.append((iteration, sum(returns) / max(len(returns), 1), len(returns)))
            returns = []
    return curve, exactness


def main(argv=None) -> int:
    p = parser("ppo_cue", __doc__)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run each")
    p.add_argument("--plot", default=None, help="a PNG of the return curves")
    args = p.parse_args(argv)
    results = {}
    for seed in args.seeds:
        began = time.time()
        results[seed], exactness = train(seed)
        worst, clipped = (max(column) for column in zip(*exactness))
        returns = ", ".join(f"{i}: {r:.2f}" for i, r, _ in results[seed])
        print(
            f"seed {seed}: return per episode (accuracy) {returns} | every update before its first "
            f"step: max |log ratio| {worst:.1e}, largest fraction outside the clip range "
            f"{clipped:.3f} ({time.time() - began:.0f} s)",
            flush=True,
        )
    if args.plot:  # the return curves, one line a seed
        curves = [(f"seed {seed}", *list(zip(*curve))[:2], {}) for seed, curve in results.items()]
        seeds = " ".join(str(seed) for seed in results)
        caption = f"python -m research.ppo_cue --seeds {seeds}; {made_with()}, CPU"
        xlabel = f"iteration ({ENVS} envs x {ROLLOUT} steps)"
        plot_curves(curves, args.plot, xlabel, "return per episode", 1 / N_CUES, caption)
    return 0


if __name__ == "__main__":
    sys.exit(main())
