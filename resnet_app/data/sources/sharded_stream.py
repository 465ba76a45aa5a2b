"""A split streamed from shards of records: TFRecord files, Parquet row groups, Arrow batches.

With S pipelines (workers) and at least S shards, pipeline s reads only shards s, s + S,
...; each epoch takes them in an order drawn from (seed, epoch), in groups of
`CYCLE_SHARDS` interleaved and shuffled by a buffer seeded by (seed, epoch, group).
Entering at an example opens only its group: nothing before is read. A run resumes exactly
with the number of workers it started with. With fewer shards than pipelines, every
pipeline reads every shard and keeps its own positions, as for tfds. An example's id is its
position in the shards taken in order.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from resnet_app.data.sources.base import RecordStream, clear_graph_seed, round_robin

CYCLE_SHARDS = 16  # Shards interleaved and shuffled together in the training stream.


@dataclasses.dataclass(eq=False)
class ShardedStream(RecordStream):
    """Shards of `counts` records each, ids [begin, end) kept. A subclass gives
    `_records(shard, offset)`, one shard's (id, record) from id `offset`, and
    `_example(id, record)`, the example's (id - begin, encoded image, label)."""

    counts: np.ndarray

    def __post_init__(self):
        self.counts = np.asarray(self.counts, np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)
        # Records of each shard inside [begin, end), and the shards that have any.
        begin, end, counts = self.begin, self.end, self.counts
        self.kept = np.clip(end - self.offsets, 0, counts) - np.clip(
            begin - self.offsets, 0, counts
        )
        self.used = np.flatnonzero(self.kept > 0)

    def _records(self, shard, offset):
        raise NotImplementedError

    def _example(self, example_id, record):
        raise NotImplementedError

    def _lane(self, num_shards: int, shard_index: int) -> tuple[np.ndarray, bool]:
        """(the shards pipeline `shard_index` reads, whether they are its own)."""
        if len(self.used) >= num_shards:
            return self.used[shard_index::num_shards], True
        return self.used, False

    def shard_sizes(self, num_shards: int) -> list[int]:
        if len(self.used) >= num_shards:
            return [int(self.kept[self.used[i::num_shards]].sum()) for i in range(num_shards)]
        return round_robin(self.end - self.begin, num_shards)

    def _read(self, shards):
        """Records of `shards` (an int tensor of shard numbers) interleaved, as (id, record)."""
        import tensorflow as tf

        from resnet_app.data import options

        offsets = tf.gather(tf.constant(self.offsets), shards)
        stream = tf.data.Dataset.from_tensor_slices((shards, offsets)).interleave(
            self._records,
            cycle_length=CYCLE_SHARDS,
            block_length=1,
            num_parallel_calls=min(CYCLE_SHARDS, options.parallel_calls()),
            deterministic=True,
        )
        if self.begin > 0 or self.end < int(self.counts.sum()):
            begin, end = self.begin, self.end
            stream = stream.filter(lambda i, _: (i >= begin) & (i < end))
        return stream

    def training(self, seed, start_example, num_shards, shard_index, buffer):
        import tensorflow as tf

        from resnet_app.data import options, seeds

        lane, own = self._lane(num_shards, shard_index)
        position = start_example // num_shards if own else start_example
        epoch_size = int(self.kept[lane].sum())
        groups = -(-len(lane) // CYCLE_SHARDS)
        first_epoch, within = divmod(position, epoch_size)
        # The group that holds example `within` of the first epoch, and where in it.
        order = lane[_shard_order(len(lane), seed, first_epoch).numpy()]
        group_sizes = np.add.reduceat(self.kept[order], np.arange(0, len(lane), CYCLE_SHARDS))
        first_group = int(np.searchsorted(np.cumsum(group_sizes), within, side="right"))
        skip = within - int(group_sizes[:first_group].sum())
        first_unit = first_epoch * groups + first_group
        lane_tensor = tf.constant(lane, tf.int64)

        def group_records(unit):
            clear_graph_seed()
            epoch, group = unit // groups, unit % groups
            shards = tf.gather(lane_tensor, _shard_order(len(lane), seed, epoch))
            shards = shards[group * CYCLE_SHARDS : (group + 1) * CYCLE_SHARDS]
            group_key = tf.random.experimental.stateless_fold_in(
                seeds.stream_seed(seed, seeds.RECORDS, epoch), group
            )
            buffer_seed = tf.random.stateless_uniform(
                [], group_key, minval=None, maxval=None, dtype=tf.int64
            )
            records = self._read(shards).shuffle(buffer, seed=buffer_seed)
            records = records.skip(
                tf.where(tf.equal(unit, first_unit), tf.constant(skip, tf.int64), 0)
            )
            return records.map(lambda i, record: (epoch, i, record))

        group_records = tf.autograph.experimental.do_not_convert(group_records)
        stream = tf.data.Dataset.range(first_unit, 1 << 62).flat_map(group_records)
        stream = stream.map(
            lambda epoch, i, record: (epoch, *self._example(i, record)),
            num_parallel_calls=options.parallel_calls(),
        )
        return stream if own else stream.shard(num_shards, shard_index)

    def evaluation(self, num_shards, shard_index):
        import tensorflow as tf

        from resnet_app.data import options

        lane, own = self._lane(num_shards, shard_index)

        def example(i, record):
            example_id, image, label = self._example(i, record)
            return {"id": example_id, "image": image, "label": label}

        # One shard after another, in file order.
        records = tf.data.Dataset.from_tensor_slices(lane).flat_map(
            lambda shard: self._read(tf.reshape(shard, [1]))
        )
        stream = records.map(example, num_parallel_calls=options.parallel_calls())
        return stream if own else stream.shard(num_shards, shard_index)


def _shard_order(count: int, seed: int, epoch):
    import tensorflow as tf

    from resnet_app.data import seeds

    order_seed = seeds.stream_seed(seed, seeds.RECORDS, epoch)
    return tf.random.experimental.stateless_shuffle(tf.range(count, dtype=tf.int64), order_seed)
