"""`pdorch bench profile`: the per-replica capacity the planner sizes the fleet from (issue 52).

On a real local cluster of one prefill and one decode worker (`pdorch serve`, free ports), with uncached
prompts (every request's ids are its own: no prefix cache or store hit is possible, and the bench checks
each reply reports 0 cached tokens):

- prefill, per prompt length L: `ttft_s` = median TTFT of one request of L tokens alone (1 output token,
  nothing else in flight); `tokens_per_s` = K x L / (time until the last of K requests sent at once has
  its first token), K = --saturate-tokens / L (at least 4). It includes one request's fixed path
  (router, KV transfer, first decode step) once: it errs low, the safe side for a planner.
- decode, per batch B and context C: B concurrent streams of C-token prompts (ignore_eos), primed first
  so they enter the batch together (bench/profile/measure.py). Only the window where all B streams are
  decoding counts: `tokens_per_s` = tokens arriving in it / its length, `itl_s` = p90 of the gaps ending
  in it. The streams are closed once each has --min-window-tokens tokens in the window.

The file is the planner's profile format (docs/operations.md, "Autoscaling on Kubernetes").
"""
