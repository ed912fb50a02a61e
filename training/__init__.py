"""The trainer of seeds-rl: SEEDS-R1's SFT warm start and PPO.

At the top only what is run or configured by name: ``ppo`` (the PPO loop), ``sft`` (the warm
start's recipe), ``seed_spread`` and ``rescore`` (reports over runs), ``config`` and ``sft_config``
(their sections: ``config_sections``, ``sft_sections``).
The rest sits in rooms, each named by its ``__init__`` docstring: ``algorithm``, ``runtime``,
``teachers``, ``models``, ``rollouts``, ``evaluation``, ``warm_start``, ``ppo_loop``, ``studies``.
Imports run down one stack (``tests/test_import_graph.py``, ``TRAINING_LAYERS``; docs/training.md).
"""
