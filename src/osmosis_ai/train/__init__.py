"""RL training: the loop from dataset rows to rollouts, rewards and policy updates, plus the
tiny local model (:mod:`osmosis_ai.train.tiny_model`) that tests and examples train offline.
"""
