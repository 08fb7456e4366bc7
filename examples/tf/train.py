"""A small TensorFlow training job for dpro's tests and benches (no dpro code in it).

    python examples/tf/train.py [--mode loop|fit] [--strategy none|mwms|ps] [--steps N] ...

* ``--mode loop``: a custom loop around one ``@tf.function`` step; ``--mode fit``: Keras ``fit``.
* ``--strategy mwms``: ``MultiWorkerMirroredStrategy`` (collective all-reduce, needs ``TF_CONFIG``
  with ``worker`` tasks); ``--strategy ps``: ``ParameterServerStrategy`` (asynchronous; this
  process is the coordinator, ``TF_CONFIG`` names ``worker``/``ps`` tasks that run
  ``--serve``); ``--serve``: run this process's ``TF_CONFIG`` task as a ``tf.distribute.Server``.
* Prints one JSON line at the end: ``{"steps", "wall_s", "steps_per_s", "step_ms": [...]}``
  (``steps_per_s`` over the steps after ``--warmup``); ``--strategy ps`` prints ``placement`` instead
  of ``step_ms``, and with ``--step-times`` each measured step's worker clock at its start and when its
  gradients are ready (``step_times``: how the workers' steps interleave) and the PS's clock once the step's variable
  writes are done (``applied_times``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def build(tf, keras, width: int, depth: int):
    layers = [keras.Input((width,))]
    for _ in range(depth):
        layers.append(keras.layers.Dense(width, activation="relu"))
    layers.append(keras.layers.Dense(10))
    return keras.Sequential(layers)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["loop", "fit"], default="loop")
    ap.add_argument("--strategy", choices=["none", "mwms", "ps"], default="none")
    ap.add_argument("--serve", action="store_true", help="run this TF_CONFIG task as a server and block")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="intra- and inter-op threads")
    ap.add_argument("--step-times", action="store_true",
                    help="--strategy ps: each measured step also returns its worker's clock at its start (before "
                         "its reads) and when its gradients are ready; printed as \"step_times\" [[start, grads], ...]")
    args = ap.parse_args(argv)

    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    if args.serve:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                      task_index=resolver.task_id, protocol="grpc", start=True)
        server.join()
        return 0
    import keras
    tf.random.set_seed(0)
    if args.strategy == "mwms":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    elif args.strategy == "ps":
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    else:
        strategy = tf.distribute.get_strategy()
    with strategy.scope():
        model = build(tf, keras, args.width, args.depth)
        opt = keras.optimizers.SGD(0.01)
    x = tf.random.normal((args.batch, args.width))
    y = tf.random.uniform((args.batch,), maxval=10, dtype=tf.int32)
    times = []
    if args.mode == "fit":
        class T(keras.callbacks.Callback):
            def on_train_batch_begin(self, b, logs=None):
                self.t0 = time.perf_counter()

            def on_train_batch_end(self, b, logs=None):
                times.append(time.perf_counter() - self.t0)
        model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        ds = tf.data.Dataset.from_tensors((x, y)).repeat()
        t0 = time.perf_counter()
        model.fit(ds, steps_per_epoch=args.steps, epochs=1, verbose=0, callbacks=[T()])
    else:
        lossf = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                           reduction="sum_over_batch_size")

        @tf.function
        def train_step(x, y):
            with tf.GradientTape() as tape:
                loss = lossf(y, model(x))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        if args.strategy == "ps":
            coord = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)

            def timed_step(x, y):    # --step-times: the same step between two reads of the worker's clock
                t_start = tf.timestamp()
                with tf.control_dependencies([t_start]):     # before the variables' reads
                    with tf.GradientTape() as tape:
                        loss = lossf(y, model(x))
                    grads = tape.gradient(loss, model.trainable_variables)
                with tf.control_dependencies(grads):
                    t_grads = tf.timestamp()
                graph = tf.compat.v1.get_default_graph()
                n0 = len(graph.get_operations())
                opt.apply_gradients(zip(grads, model.trainable_variables))
                writes = [op for op in graph.get_operations()[n0:]
                          if op.type in ("AssignSubVariableOp", "AssignAddVariableOp", "AssignVariableOp")
                          or op.type.startswith("ResourceApply")]
                first = model.trainable_variables[0]
                with tf.device(getattr(first, "_value", first).device), tf.control_dependencies(writes):
                    t_applied = tf.timestamp()     # on the (first variable's) PS, once the step's writes are done
                return loss, t_start, t_grads, t_applied

            @tf.function
            def worker_fn():
                return strategy.run(timed_step if args.step_times else train_step, args=(x, y))

            for _ in range(args.warmup):   # traced and warm on every worker
                coord.schedule(worker_fn)
            coord.join()
            t0 = time.perf_counter()
            results = [coord.schedule(worker_fn) for _ in range(args.steps)]
            coord.join()
            wall = time.perf_counter() - t0
            extra = {}
            if args.step_times:      # one clock on emulated hosts (one machine): comparable across workers
                vals = [[float(v) for v in r.fetch()[1:]] for r in results]
                extra["step_times"] = [v[:2] for v in vals]
                extra["applied_times"] = [v[2] for v in vals]    # the PS's clock when the step's writes were done
            # where each variable lives (task index of its PS): ParameterServerStrategy's own placement
            placement = {}
            for v in list(model.variables) + list(opt.variables):
                tv = getattr(v, "_value", v)          # keras 3 wraps the tf.Variable
                dev = str(getattr(tv, "device", "") or "")
                if "/job:ps" in dev and "/task:" in dev:
                    placement[tv.name] = int(dev.split("/task:")[1].split("/")[0])
            print(json.dumps({"steps": args.steps, "wall_s": wall, "steps_per_s": args.steps / wall,
                              "placement": placement, **extra}), flush=True)
            return 0
        t0 = time.perf_counter()
        for _ in range(args.steps):
            s = time.perf_counter()
            if args.strategy == "mwms":
                strategy.run(train_step, args=(x, y))
            else:
                train_step(x, y)
            times.append(time.perf_counter() - s)
    wall = time.perf_counter() - t0
    rest = times[args.warmup:] or times
    print(json.dumps({"steps": len(times), "wall_s": wall, "steps_per_s": len(rest) / sum(rest),
                      "step_ms": [round(t * 1e3, 3) for t in times]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
