"""The slow tier (`pytest -m slow`, run by CI after the suite): repeats of what the default suite
checks once, each named with the test that keeps its guarantee in the default suite.

Keys are node ids under tests/: "file.py::test" (every parameter), "file.py::test[id]" (one),
or "file.py::test" with DEEPER (its parameters naming a preset deeper than DEEPEST_DEFAULT).
`conftest.py` marks them and fails the collection when `check` finds a key or a representative
that is not a test, or a representative that is slow too.
"""

from __future__ import annotations

from tests import tiers

DEEPEST_DEFAULT = 50  # ResNet-50 and its family stay in the suite.
DEEPER = "deeper"

MATRIX_OWN = "test_matrix_own_data.py::test_every_command_works_or_refuses_in_one_line"
MATRIX_BUILTIN = "test_matrix_builtin.py::test_every_command_works_or_refuses_in_one_line"
FAMILY_EXPORT = "test_export_formats.py::" + (
    "test_the_familys_layers_export_to_every_format_with_the_trained_numbers"
)
MATRIX_KIND = "every command on one more kind of data (its source's own tests train on it)"
KILLED_CHIEF = "test_worker_loss.py::test_a_killed_chief_costs_no_step_and_a_rerun_resumes_bitwise"
SIGKILL = "test_checkpoint.py::test_sigkill_between_checkpoints_then_resume_is_bitwise_identical"
EXPORT = "test_export.py::test_export_in_a_process_without_resnet_app_equals_the_evaluation"
AVERAGING = "test_averaging.py::test_averaging_every_step_is_the_one_device_update"

# {key: (what it adds to its representative, the representative in the default suite)}
MOVED: dict[str, tuple[str, str]] = {
    "test_bad_files.py::test_every_other_bad_file_is_one_line": (
        "every command on every bad file kind",
        "test_bad_files.py::test_a_bad_file_is_one_line",
    ),
    # The no-traceback matrix stays on shapes and tfds offline.
    f"{MATRIX_OWN}[folder]": (MATRIX_KIND, EXPORT),
    f"{MATRIX_OWN}[csv]": (
        MATRIX_KIND,
        "test_multi_label.py::test_training_reports_map_and_f1_and_keeps_the_best_by_map",
    ),
    f"{MATRIX_OWN}[multi-label csv]": (
        "every command on a multi-label table",
        "test_multi_label.py::test_every_export_format_gives_sigmoid_probabilities",
    ),
    f"{MATRIX_OWN}[idx]": (MATRIX_KIND, "test_idx_source.py::test_trains_from_the_command_line"),
    f"{MATRIX_OWN}[cifar]": (
        MATRIX_KIND,
        "test_cifar_source.py::test_trains_and_evaluates_every_test_example_once",
    ),
    "test_hugging_face.py::test_a_streamed_run_killed_mid_epoch_resumes_bitwise": (
        "kill -9 and resume on Parquet row groups (the same ShardedStream as TFRecords)",
        "test_tfrecord.py::test_a_mid_epoch_kill_resumes_bitwise",
    ),
    f"{MATRIX_OWN}[hf]": (
        MATRIX_KIND,
        "test_hugging_face.py::"
        "test_trains_from_the_command_line_and_refuses_a_wrong_column_in_one_line",
    ),
    f"{MATRIX_BUILTIN}[tfrecord]": (
        MATRIX_KIND,
        "test_tfrecord.py::test_a_mid_epoch_kill_resumes_bitwise",
    ),
    f"{MATRIX_BUILTIN}[synthetic]": (
        "every command on synthetic data (no images for int8 or parity)",
        "test_export_formats.py::test_a_run_on_synthetic_data_exports_without_a_parity_report",
    ),
    "test_source_plugin.py::test_the_matrix_runs_every_command_on_the_plugins_example": (
        "the matrix on a plugin's source",
        "test_source_plugin.py::test_the_plugin_is_listed_parsed_and_loaded",
    ),
    # Several workers: one scenario of each kind stays.
    "test_worker_loss.py::test_a_killed_worker_costs_no_step_and_the_launcher_resumes_bitwise": (
        "the launcher restarting the pair after a kill -9 of worker 1",
        KILLED_CHIEF,
    ),
    "test_worker_loss.py::test_a_stalled_worker_is_found_within_the_timeout": (
        "a SIGSTOPped worker found by sync.timeout",
        KILLED_CHIEF,
    ),
    "test_multiworker.py::test_two_workers_end_with_identical_weights_and_resume": (
        "two workers trained, stopped and resumed without a fault",
        KILLED_CHIEF,
    ),
    "test_slurm.py::test_two_tasks_under_srun_train_as_two_workers_as_a_tfjob_does": (
        "two SLURM tasks training as the workers of a TFJob",
        "test_slurm.py::test_two_nodes_two_tasks_each_job_id_ports",
    ),
    "test_slurm_preemption.py::test_a_notice_to_one_worker_makes_every_worker_save_and_exit_3": (
        "a notice to one of two workers",
        "test_launch.py::test_a_preemption_notice_reaches_every_worker_and_the_launcher_asks_for_a_requeue",
    ),
    "test_slurm_preemption.py::test_sigusr1_is_a_preemption_notice_and_sigterm_is_not": (
        "SIGTERM after SIGUSR1 is still a stop",
        "test_checkpoint.py::test_sigterm_saves_a_checkpoint_and_exits_0_then_resumes",
    ),
    "test_slurm_preemption.py::test_sigusr1_saves_exits_3_and_the_requeued_run_resumes_bitwise": (
        "SLURM's notice to one trainer, its exit 3 and the requeued run",
        "test_launch.py::test_a_preemption_notice_reaches_every_worker_and_the_launcher_asks_for_a_requeue",
    ),
    "test_launch.py::test_a_port_another_program_took_is_given_up_at_once": (
        "a port taken by another program between the choice and the bind",
        "test_launch.py::test_the_ports_chosen_are_free_and_kept_on_every_interface_but_for_the_workers",
    ),
    "test_evaluate_cli.py::test_two_workers_count_every_example_once_and_the_chief_reports": (
        "evaluate as two worker processes",
        "test_calibrated_eval.py::test_two_workers_gather_every_examples_logits",
    ),
    "test_averaging.py::test_two_workers_end_with_the_same_global_model": (
        "model averaging across two worker processes",
        AVERAGING,
    ),
    # Towers: three where two show the mechanism.
    "test_averaging.py::test_copies_drift_between_averages_and_become_their_mean[3]": (
        "the mean of three towers' copies",
        "test_averaging.py::test_copies_drift_between_averages_and_become_their_mean[2]",
    ),
    # Resume and export of one more network of the family.
    "test_modern_resume.py::test_sigkill_of_a_family_network_resumes_bitwise": (
        "kill -9 and resume of a family network",
        SIGKILL,
    ),
    "test_modern_resume.py::test_sigkill_with_every_modern_piece_on_resumes_bitwise": (
        "kill -9 and resume with every piece of the modern recipe on at once",
        SIGKILL,
    ),
    f"{FAMILY_EXPORT}[eca]": ("ECA's layer in every format", f"{FAMILY_EXPORT}[se]"),
    # Sweeps: a killed sweep and trials side by side stay.
    "test_sweep.py::test_sweeps_in_two_directories_share_one_study_through_its_database": (
        "two sweep processes sharing one SQLite study",
        "test_sweep.py::test_a_sweep_runs_trials_side_by_side_scores_them_on_the_holdout_and_writes_the_best",
    ),
    "test_sweep.py::test_a_grid_sweep_runs_each_point_once_and_a_diverged_trial_does_not_stop_it": (
        "a grid sweep end to end, one trial diverging",
        "test_sweep.py::test_a_grid_keeps_its_seed_and_other_samplers_draw_on",
    ),
    "test_sweep.py::test_a_killed_sweep_resumes_its_trial_from_its_checkpoint_and_draws_no_extra": (
        "a sweep killed mid-trial, resumed",
        "test_sweep.py::test_a_sweep_resumes_only_the_unfinished_trials_it_started_here",
    ),
    # Processes that check one more setting of what a first one checks.
    "test_hardware.py::test_the_onednn_rule_agrees_with_tensorflow_here[0]": (
        "the rule with TF_ENABLE_ONEDNN_OPTS=0 in a fresh process",
        "test_hardware.py::test_the_onednn_rule_agrees_with_tensorflow_here[None]",
    ),
    "test_hardware.py::test_the_onednn_rule_agrees_with_tensorflow_here[1]": (
        "the rule with TF_ENABLE_ONEDNN_OPTS=1 in a fresh process",
        "test_hardware.py::test_the_onednn_rule_agrees_with_tensorflow_here[None]",
    ),
    "test_export.py::test_saved_model_cli_lists_the_signatures": (
        "TensorFlow's saved_model_cli reading the export",
        EXPORT,
    ),
    "test_watch.py::test_a_watcher_beside_a_training_run_reports_what_evaluate_does_afterwards": (
        "the watcher beside a training process",
        "test_watch.py::test_each_checkpoint_once_as_evaluate_does_and_a_rotated_one_skipped",
    ),
    "test_averaging.py::test_benchmark_counts_collectives_falling_by_the_interval": (
        "scripts/benchmark.py sync end to end",
        AVERAGING,
    ),
    # The networks deeper than 50 layers.
    "test_model.py::test_parameter_counts_match_the_closed_form_and_the_published_tables": (
        DEEPER,
        "test_model.py::test_parameter_counts_match_the_closed_form_and_the_published_tables[resnet50]",
    ),
    "test_model.py::test_forward_pass_logits_and_hidden_states": (
        DEEPER,
        "test_model.py::test_forward_pass_logits_and_hidden_states[resnet50]",
    ),
    "test_model.py::test_macs_match_the_closed_form": (
        DEEPER,
        "test_model.py::test_macs_match_the_closed_form[resnet20]",
    ),
    "test_timm_reference.py::test_deep_nets_stay_order_one": (
        DEEPER,
        "test_timm_reference.py::test_forward_shapes_and_scale",
    ),
    "test_torchvision_reference.py::test_activations_stay_order_one": (
        DEEPER,
        "test_torchvision_reference.py::test_activations_stay_order_one[resnet18]",
    ),
    # Kill -9 and resume of one recipe more: the default suite keeps SIGKILL and each
    # recipe's re-entry at any example.
    "test_augmix.py::test_a_kill_mid_epoch_resumes_bitwise_with_augmix_views": (
        "kill -9 and resume with AugMix's views",
        "test_augmix.py::test_the_pipeline_augments_each_example_by_its_draws_and_enters_anywhere",
    ),
    "test_progressive.py::test_a_kill_mid_ramp_resumes_bitwise_across_the_next_size_change": (
        "kill -9 and resume across a size change",
        "test_progressive.py::test_each_size_is_traced_once_and_a_resumed_run_traces_only_those_ahead",
    ),
    "test_bad_files.py::test_a_bad_file_is_one_line[train-other.weights.h5]": (
        "the train command on another network's weights file",
        "test_pretrained.py::test_a_keras3_weights_file_of_another_network_is_one_line",
    ),
    "test_startup_noise.py::test_a_closed_output_pipe_never_stops_training": (
        "a whole training run whose output pipe closes",
        "test_startup_noise.py::test_a_pipe_closed_while_tensorflow_loads_blocks_nothing",
    ),
    "test_disk_full.py::test_a_full_disk_and_a_full_memory_are_told_apart": (
        "a full memory told apart from a full disk",
        "test_disk_full.py::test_a_full_disk_stops_in_one_line_and_the_last_checkpoint_resumes",
    ),
}


def reason(nodeid: str, params: dict) -> str | None:
    """Why the collected test `nodeid` (relative to tests/) runs in the slow tier, or None."""
    key = nodeid if nodeid in MOVED else nodeid.split("[")[0]
    if key not in MOVED:
        return None
    adds, kept = MOVED[key]
    if adds == DEEPER and key != nodeid:
        strings = [value for value in params.values() if isinstance(value, str)]
        deepest = max(map(tiers.preset_depth, strings), default=0)
        if deepest <= DEEPEST_DEFAULT:
            return None
        adds = f"a preset of {deepest} layers"
    return f"{adds}; in the suite: {kept}"


def check(collected: dict[str, str | None], moved=None) -> list[str]:
    """What is wrong with `moved` (MOVED), given {node id: its slow reason or None} of a collection.

    Only the collected files are judged: each key must name a collected test, and each
    representative a collected test (or a parameter of it) that stays in the default suite.
    """

    def matching(name):
        return [
            reason
            for nodeid, reason in collected.items()
            if nodeid == name or ("[" not in name and nodeid.split("[")[0] == name)
        ]

    files = {nodeid.split("::")[0] for nodeid in collected}
    problems = []
    for key, (_, kept) in (MOVED if moved is None else moved).items():
        if key.split("::")[0] in files and not matching(key):
            problems.append(f"tests/slow_tier.py moves {key}, which is not a test")
        if kept.split("::")[0] not in files:
            continue
        reasons = matching(kept)
        if not reasons:
            problems.append(f"{key} is covered by {kept}, which is not a test")
        elif None not in reasons:
            problems.append(f"{key} is covered by {kept}, which is in the slow tier too")
    return problems
