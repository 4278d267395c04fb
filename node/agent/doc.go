// Package agent is edgefl's edge daemon: one MQTT session to the federation's
// broker, one bbolt state file (edgestore.EdgeStore) and one site's training
// data, which never leaves the site.
//
// # Round handling (RoundHandler)
//
// The round logic has no networking in it: RoundHandler.Handle takes a
// validated wire.RoundAnnouncement and returns the encoded update to publish,
// having done every durable effect first. For a round that selects this site
// (an empty selection selects everyone, except with private_selection: then
// only HandleInvited with an invitation does) and that it has not applied:
//
//  1. everything is checked before anything is written: the federation, the
//     model (model.New), that the local data fit it (model.CheckTargets),
//     the uplink codec, the global model's frame (quant.Inspect, dimension =
//     the model's parameter count, then quant decoding, which refuses NaN and
//     Inf), the solver parameters and the budget. A failure wraps
//     ErrBadAnnouncement and leaves the store untouched;
//  2. SetGlobal(round, x);
//  3. the site's work as package round defines it for the sites and
//     simulate alike (round.Prepare checks and resolves the announced
//     parameters, round.Work.Solve runs them): the local solve
//     (proxsolver.Solve) under min(device budget, round
//     budget): epochs, gradient evaluations, and a deadline = the earlier of
//     now + max seconds and the round's deadline less Local.DeadlineMargin,
//     read through the injected clock; a solve nothing limits gets
//     Local.FallbackSeconds. fedavg solves with mu = 0; fedprox and any other
//     family with the announced mu, anchored at x. fedsplit and fedproxsplit
//     run FedSplit's client step (round.Work.Solve) from the stored z_j (InitZ with x on first sight)
//     with the prox being proxsolver.Solve anchored at v = 2x - z_j with
//     mu = 1/s_j, warm-started at x, where s_j = s m n_j / n from the
//     announced step s, number of clients m and total samples n
//     (split.ClientStepSize; without m and n, s itself). An unset relax
//     means 1 (Peaceman-Rachford);
//  4. the result travels as a delta, encoded with the round's uplink codec
//     and decoded again to know what the aggregator will hold (uplink):
//     w - x plus the error-feedback residual of earlier rounds (kind DELTA;
//     the new residual is what the codec did not send, not kept for the
//     lossless fp32), or, for FedSplit, z_j minus the aggregator's copy of
//     z_j (kind Z_DELTA, base_round = the round that set the copy), the copy
//     being computed here exactly as the aggregator does, copy + decoded
//     delta, so both agree bit for bit. z_j - copy is FedSplit's residual:
//     it goes out with later rounds. With no copy (the first update, or
//     after a rejection) the delta is against x with base_round 0;
//  5. ONE edgestore.Commit writes z_j, the copy, the residual, the applied
//     round and the outbox entry; only then is the update published.
//
// A round at or below the applied round is never solved again: if its update
// is still in the outbox it is returned for re-sending (ActionResend). A solve
// stopped because a newer round was announced (cancel cause ErrPreempted)
// is committed and sent as partial work with stop reason SIGNAL. A solve
// stopped by shutdown commits nothing: the retained announcement restarts it.
//
// The work report comes from proxsolver.Report: achieved gamma, epochs
// (rounded), gradient evaluations, seconds (the budget clock's), the local
// loss, the anchor loss (f at the received global model x: for FedSplit the
// solve's anchor is v, so f(x) is evaluated once more, outside the budget),
// the stop reason and partial = stopped by the budget (or preempted) before
// reaching a target gamma > 0. proxsolver's "stalled" has no wire code and is
// sent as UNSPECIFIED. A solve that diverges (non-finite loss) sends the
// global model back (FedProx family) or z_j unchanged (FedSplit), with stop
// reason ERROR. When the round asks for the anchor gradient (anchor_sketch),
// the full gradient (dimension 0) or its random projection is attached; a
// sketch longer than the gradient is not computed.
//
// Randomness (SGD's shuffling, stochastic codecs) comes from streams seeded by
// Config.Seed, the site id, the round and the purpose, so a re-run of a round
// is reproducible and sites sharing a seed still draw independent
// quantisation noise.
//
// A rejection receipt for an update still in the outbox (edgestore.AckRejected)
// drops it and forgets the copy of z_j, which assumed it would be applied.
//
// # The session (Agent)
//
// Agent.Run connects with paho: client id = site id, persistent session
// (CleanSession false), QoS 1, SetOrderMatters(false), SetConnectRetry(true),
// a first connection retried every Config.ReconnectMin, auto-reconnect with
// paho's backoff (1 s doubling up to Config.ReconnectMax), a default
// publish handler through which every inbound message goes, and as last will
// the retained ClientStatus{online: false}. On every connection (the first
// one included) it subscribes to round, run (the retained RunSpec: the
// schema and transform the announcements name by digest, proto/wire/runspec.go)
// and receipts/<id>, publishes the
// retained ClientStatus{online: true, sample count, capabilities = solver
// names, version}, and re-publishes every outbox entry.
//
// Every connection attempt takes a new number from the state file
// (edgestore.EdgeStore.NextConnection, never below the wall clock in ms), set
// in its last will (paho's reconnecting handler rewrites the will before
// each reconnection attempt) and in the statuses sent on it. The aggregator
// sets aside a status older than one it has applied, so the will of a
// half-open connection, published when the broker hands the session to the
// new connection, cannot mark the connected site offline.
//
// Inbound messages are decoded with wire.Topics.Decode under the configured
// Limits; a bad one (wrong topic, size, version, schema, client id) is logged
// and counted (Stats.BadMessages) and dropped. Round announcements go to one
// goroutine that handles them in order (only the newest waiting one is kept);
// receipts are handled at once: accepted or duplicate -> edgestore.Ack;
// rejected -> logged with code and reason, counted and acked (the aggregator
// will never take that update), except RECEIPT_CODE_INTERNAL ("the client may
// retry"), which stays in the outbox and is re-sent after a backoff doubling
// from ReconnectMin to ReconnectMax (and on the next connection or
// re-announcement). An update that gets no receipt at all (lost on its way:
// dropped over the site's rate limit, say) is re-sent too, after a backoff
// doubling from ReconnectMin to ReconnectMax from its publish on, until a
// receipt comes (the aggregator answers a copy it stored DUPLICATE); it
// used to wait for a reconnection or its round's re-announcement at the
// deadline. Secure-aggregation messages keep the INTERNAL rule only. An invitation (receipt subject INVITATION, differential
// privacy's private selection; docs/privacy.md "Sampling rate") is kept in
// memory, the newest only, and makes the announcement of its round and run
// be handled as selecting this site, whichever arrives first; it is not
// stored: the aggregator invites again when the site comes online.
//
// These rules (which announcement is solved next and when a solve is
// pre-empted, what a new run resets, what a receipt does, when and after
// which backoff something is sent again, the site error and the end of a
// run) are a deterministic state machine, session.go: events in
// (announcement, solver idle, solve done, receipt, timer fired,
// connection up, statistics or evaluation emitted, shutdown), actions out
// (start or pre-empt a solve, publish, arm or stop a timer, report a
// receipt or a store failure, show or clear the site error). It does no
// I/O beyond reads of its read-only store interface (what a receipt
// removes from the outbox is an action the Agent commits) and reads no
// clock; the Agent steps it under one lock and carries out its actions,
// arming timers on Deps.Clock. A timer carries the generation it was
// armed with, so one that fires after the state moved on does nothing.
//
// On ctx cancellation Run publishes the retained offline status, disconnects
// cleanly (the will is not sent on a clean disconnect), waits for its
// handlers and closes the state file.
//
// # A federation with a schema
//
// When announcements carry a federation schema, the site's data is the
// CSV of Config.Data (csv:PATH; label= is then ignored) read by it with
// package sitedata, the same code the aggregator and simulate run:
//
//   - PHASE_STATISTICS (round 0, before round 1): sitedata.Load splits the
//     rows by the schema's hold-out rule (or, with Config.EvalData, every
//     row of Data trains and EvalData's rows are held out), and the
//     SiteStatistics of the training rows (prep.Stats JSON, the schema's
//     digest, the run id) go out on the site's update topic;
//   - PHASE_TRAIN with a transform: the training data are the site's
//     Data(transform), cached per run, schema and transform; the round is
//     solved exactly as without a schema. With evaluate, every site
//     (selected or not) first sends an EvalReport of the announced global
//     model on its held-out rows (sitedata.Evaluate), named by eval_round;
//   - PHASE_FINISHED: the final EvalReport when asked and the bundle is not
//     there yet; with the bundle, bundle.Unmarshal verifies its digest, its
//     schema must be the federation's and its run the announcement's, and
//     it is stored in the state file (edgestore.EdgeStore.SetFinal, which also
//     empties the outbox) and written atomically to Config.ModelOut. The
//     agent logs "federation finished; final model written" once, solves and
//     sends nothing more (a solve in progress is abandoned, ErrFinished) and
//     ignores the finished run's announcements, also after a restart (which
//     rewrites ModelOut from the state file if the file is missing or
//     different), until another run id is announced. Without a schema the
//     end of a run is logged and the site stays quiet the same way.
//
// Statistics and evaluation reports are kept in memory until the
// aggregator's receipt of that subject (Receipt.subject STATISTICS or
// EVALUATION) and round: re-sent after a backoff doubling from
// ReconnectMin to ReconnectMax, and on every reconnection; the retained
// announcement makes them again after a restart (the aggregator answers a
// repeat DUPLICATE).
//
// A site that cannot take part (sitedata.SiteError: a missing column, a bad
// cell, an unknown label, too few rows, a transform, schema or bundle
// refused, a failed solve, a disk error; the last two also without a
// schema) logs the full error once at ERROR (it may show the offending
// cell) and publishes its retained status with error_reason and
// error_message = SiteError.Public(), which names file, line, column and
// what was expected but no data value. The next announcement the site
// serves with its data (statistics, an evaluation, a solved round, the
// final bundle) clears it with a new status. With a schema the status's
// sample_count is the training rows.
//
// # Data
//
// Config.Data is a dataset source spec. With DataClient = -1 the whole source
// is the site's data (csv, idx, leaf); with DataClient = K the source is
// partitioned like the simulator does and the site trains on client K's
// training split (demos: synthetic:1,1 with natural partition). Deps.Data
// bypasses loading altogether, for running many agents in one process.
package agent
