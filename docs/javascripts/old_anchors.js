// The results were one page; each question now has its own (docs/results/). A link to a section of the one page,
// results.html#anchor, lands on the section's new page: this map, read on results.html only, sends it there.
// tests/test_docs.py checks that every target exists in the built site.
var OLD_ANCHORS = {
  "the-lag-robustness-study": "results/scores.html#the-lag-robustness-study",
  "lag-robustness-at-300k-steps": "results/study-300k.html#lag-robustness-at-300k-steps",
  "aggregates-of-the-final-score-300k-steps": "results/study-300k.html#aggregates-of-the-final-score-300k-steps",
  "probability-of-improvement-300k-steps": "results/study-300k.html#probability-of-improvement-300k-steps",
  "baselines-and-ablations-at-k-1-and-8": "results/study-300k.html#baselines-and-ablations-at-k-1-and-8",
  "choosing-the-tv-threshold": "results/choosing-delta.html#choosing-the-tv-threshold",
  "choosing-the-sweep": "results/choosing-delta.html#choosing-the-sweep",
  "the-sweeps-table-300k-steps": "results/choosing-delta.html#the-sweeps-table-300k-steps",
  "the-finalists-at-1m-steps-and-the-default": "results/choosing-delta.html#the-finalists-at-1m-steps-and-the-default",
  "the-finalists-table-1m-steps": "results/choosing-delta.html#the-finalists-table-1m-steps",
  "held-out-tasks-at-1m-steps-walker2d-and-ant": "results/choosing-delta.html#held-out-tasks-at-1m-steps-walker2d-and-ant",
  "aggregates-of-the-final-score-held-out-tasks-1m-steps": "results/choosing-delta.html#aggregates-of-the-final-score-held-out-tasks-1m-steps",
  "probability-of-improvement-held-out-tasks-1m-steps": "results/choosing-delta.html#probability-of-improvement-held-out-tasks-1m-steps",
  "every-final-return-at-1m-steps": "results/choosing-delta.html#every-final-return-at-1m-steps",
  "all-ten-tasks-at-1m-steps": "results/scores.html#all-ten-tasks-at-1m-steps",
  "vaco-against-ppo-on-each-task": "results/paper-number.html#vaco-against-ppo-on-each-task",
  "lag-recovered": "results/lag-recovered.html#lag-recovered",
  "decoupled-ppo-and-vaco-task-by-task": "results/lag-recovered.html#decoupled-ppo-and-vaco-task-by-task",
  "which-trust-region": "results/trust-region.html#which-trust-region",
  "how-much-lag": "results/how-much-lag.html#how-much-lag",
  "aggregates-over-the-ten-tasks": "results/paper-number.html#aggregates-over-the-ten-tasks",
  "the-papers-summary-number": "results/paper-number.html#the-papers-summary-number",
  "where-vaco-is-behind": "results/vaco-behind.html#where-vaco-is-behind",
  "the-main-job-at-3m-steps": "results/main-job-3m.html#the-main-job-at-3m-steps",
  "compiled-vs-eager": "results/speed.html#compiled-vs-eager",
  "asynchrony-wall-clock": "results/asynchrony.html#asynchrony-wall-clock",
  "speed": "results/speed.html#speed",
  "where-an-env-steps-time-goes": "results/speed.html#where-an-env-steps-time-goes",
  "what-the-rollout-does-less": "results/speed.html#what-the-rollout-does-less",
  "the-asynchronous-script": "results/speed.html#the-asynchronous-script",
  "the-update-step": "results/speed.html#the-update-step",
  "grpo-under-forward-lag-cpu": "results/grpo.html#grpo-under-forward-lag-cpu"
};
(function () {
  var target = OLD_ANCHORS[decodeURIComponent(window.location.hash.slice(1))];
  if (target) window.location.replace(target);
})();
