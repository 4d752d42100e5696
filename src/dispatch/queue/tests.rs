//! The queue's tests: fairness, capacity, cancellation, the gate.

mod fairness {
    use super::super::*;

    fn backend(max_concurrency: usize) -> BackendQueue {
        BackendQueue::new("b", max_concurrency, true, Metrics::new(), Arc::new(Notify::new()))
    }

    fn queue(max_concurrency: usize, max_queue: usize) -> (BackendQueue, ModelSlot) {
        let q = backend(max_concurrency);
        let slot = q.add_model("m", max_queue, Duration::from_secs(60));
        (q, slot)
    }

    fn client(name: &str) -> ClientId {
        ClientId(name.to_string())
    }

    /// Polls until `n` requests wait in the model's queue.
    async fn until_waiting(slot: &ModelSlot, n: usize) {
        while slot.shared.lock().models[slot.index].waiting != n {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn grants_up_to_capacity_then_queues_then_rejects() {
        let (_q, slot) = queue(2, 1);
        let a = slot.acquire(client("a")).await.expect("slot 1");
        let _b = slot.acquire(client("a")).await.expect("slot 2");
        let s2 = slot.clone();
        let waiting = tokio::spawn(async move { s2.acquire(client("a")).await });
        until_waiting(&slot, 1).await;
        let full = slot.acquire(client("a")).await.err().expect("queue full");
        assert!(matches!(full, GatewayError::QueueFull { waiting: 1, in_flight: 2, .. }), "{full:?}");
        drop(a);
        let third = waiting.await.expect("task").expect("slot handed over");
        assert_eq!(slot.shared.lock().backends[0].in_flight, 2);
        drop(third);
        assert_eq!(slot.shared.lock().backends[0].in_flight, 1);
    }

    #[tokio::test]
    async fn round_robin_across_clients() {
        let (_q, slot) = queue(1, 16);
        let held = slot.acquire(client("hog")).await.expect("slot");
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        let enqueue = |name: &'static str, n: usize, tasks: &mut Vec<_>| {
            for _ in 0..n {
                let s = slot.clone();
                let order = Arc::clone(&order);
                tasks.push(tokio::spawn(async move {
                    let permit = s.acquire(client(name)).await.expect("slot");
                    order.lock().expect("lock").push(name);
                    drop(permit);
                }));
            }
        };
        enqueue("hog", 5, &mut tasks);
        until_waiting(&slot, 5).await;
        enqueue("small", 2, &mut tasks);
        until_waiting(&slot, 7).await;
        drop(held);
        for t in tasks {
            t.await.expect("task");
        }
        let order = order.lock().expect("lock").clone();
        assert_eq!(order, ["hog", "small", "hog", "small", "hog", "hog", "hog"]);
    }

    #[tokio::test]
    async fn cancelled_waiter_leaves_no_trace_and_times_out() {
        let q = backend(1);
        let slot = q.add_model("m", 4, Duration::from_millis(50));
        let held = slot.acquire(client("a")).await.expect("slot");
        let s2 = slot.clone();
        let task = tokio::spawn(async move { s2.acquire(client("b")).await });
        until_waiting(&slot, 1).await;
        task.abort();
        let _ = task.await;
        assert_eq!(slot.shared.lock().models[0].waiting, 0);
        let timed_out = slot.acquire(client("c")).await.err().expect("times out");
        assert!(matches!(timed_out, GatewayError::QueueTimeout { .. }), "{timed_out:?}");
        drop(held);
        assert_eq!(slot.shared.lock().backends[0].in_flight, 0);
        let _again = slot.acquire(client("c")).await.expect("free again");
    }

    #[tokio::test]
    async fn round_robin_across_models_of_one_backend() {
        let q = backend(1);
        let m1 = q.add_model("m1", 8, Duration::from_secs(60));
        let m2 = q.add_model("m2", 8, Duration::from_secs(60));
        let held = m1.acquire(client("a")).await.expect("slot");
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (slot, name) in [(&m1, "m1"), (&m1, "m1"), (&m1, "m1"), (&m2, "m2")] {
            let s = slot.clone();
            let order = Arc::clone(&order);
            tasks.push(tokio::spawn(async move {
                let p = s.acquire(client("a")).await.expect("slot");
                order.lock().expect("lock").push(name);
                drop(p);
            }));
            while slot.shared.lock().models.iter().map(|m| m.waiting).sum::<usize>() != tasks.len() {
                tokio::task::yield_now().await;
            }
        }
        drop(held);
        for t in tasks {
            t.await.expect("task");
        }
        assert_eq!(order.lock().expect("lock")[..2], ["m1", "m2"]);
    }
}

mod gate {
    use super::super::*;

    #[tokio::test]
    async fn a_closed_gate_queues_and_opening_dispatches_up_to_capacity() {
        let q = BackendQueue::new("b", 2, false, Metrics::new(), Arc::new(Notify::new()));
        let slot = q.add_model("m", 8, Duration::from_secs(60));
        let mut tasks = Vec::new();
        for i in 0..3 {
            let s = slot.clone();
            tasks.push(tokio::spawn(async move { s.acquire(ClientId(format!("c{i}"))).await }));
        }
        while q.view().waiting != 3 {
            tokio::task::yield_now().await;
        }
        assert!(q.view().oldest_wait.is_some());
        q.open();
        assert_eq!((q.view().waiting, q.view().in_flight), (1, 2));
        let first = tasks.remove(0).await.expect("task").expect("permit");
        q.close();
        drop(first);
        assert_eq!(q.view().in_flight, 1, "a closed gate does not hand the slot on");
        assert_eq!(q.view().waiting, 1);
        q.fail("crashed 5 times");
        let results = [tasks.remove(0).await.expect("task"), tasks.remove(0).await.expect("task")];
        let refused = results.into_iter().filter_map(Result::err).next().expect("the waiter is refused");
        assert!(matches!(refused, GatewayError::BackendFailed { .. }), "{refused:?}");
        let now = slot.acquire(ClientId("x".into())).await.err().expect("refused at once");
        assert!(now.to_string().contains("crashed 5 times"), "{now}");
    }

    #[tokio::test]
    async fn the_gate_is_working_while_a_slot_is_held_for_somebody() {
        let q = BackendQueue::new("b", 2, true, Metrics::new(), Arc::new(Notify::new()));
        let slot = q.add_model("m", 8, Duration::from_secs(60));
        assert!(!Gate::working(&q), "no slot held");
        let mut held = slot.acquire(ClientId("a".into())).await.expect("permit");
        assert!(Gate::working(&q));
        held.abandon();
        assert!(!Gate::working(&q), "a slot held for an abandoned answer is no work a drain waits for");
        drop(held);
        assert!(!Gate::working(&q));
    }
}

mod several {
    use super::super::*;
    use crate::dispatch::route::{Candidate, Choice, Reason};

    fn two(slots: usize) -> (BackendQueue, BackendQueue, ModelSlot) {
        let pool = Pool::new(Metrics::new(), Arc::new(Notify::new()));
        let a = pool.add_backend("a", slots, true);
        let b = pool.add_backend("b", slots, true);
        let slot = pool.add_model("m", 8, Duration::from_secs(60), &[&a, &b]);
        (a, b, slot)
    }

    fn client(name: &str) -> ClientId {
        ClientId(name.to_string())
    }

    #[tokio::test]
    async fn equal_load_goes_to_the_first_then_the_least_loaded() {
        let (a, b, slot) = two(2);
        let first = slot.acquire(client("x")).await.expect("slot");
        let second = slot.acquire(client("x")).await.expect("slot");
        assert_eq!((first.position(), second.position()), (0, 1));
        assert_eq!((a.view().in_flight, b.view().in_flight), (1, 1));
    }

    #[tokio::test]
    async fn a_preferring_waiter_takes_any_free_slot_at_its_deadline() {
        let (_a, b, slot) = two(1);
        let held = slot.acquire(client("x")).await.expect("slot");
        assert_eq!(held.position(), 0);
        let mut prefer_a = |_: &[Candidate<'_>]| Choice {
            now: None,
            prefer: Some((0, Duration::from_millis(30))),
            reason: Reason::CacheHit,
        };
        let ask = Ask { client: client("y"), limit: Duration::MAX, excluded: 0, router: Some(&mut prefer_a) };
        let permit = slot.acquire_with(ask).await.expect("slot");
        assert_eq!(permit.position(), 1, "after its deadline it took b's free slot");
        assert_eq!(b.view().in_flight, 1);
        drop(held);
    }

    #[tokio::test]
    async fn a_preferring_waiter_gets_its_backend_when_it_frees_first() {
        let (_a, _b, slot) = two(1);
        let held = slot.acquire(client("x")).await.expect("slot");
        let s2 = slot.clone();
        let waiter = tokio::spawn(async move {
            let mut prefer_a = |_: &[Candidate<'_>]| Choice {
                now: None,
                prefer: Some((0, Duration::from_secs(600))),
                reason: Reason::CacheHit,
            };
            let ask = Ask { client: client("y"), limit: Duration::MAX, excluded: 0, router: Some(&mut prefer_a) };
            s2.acquire_with(ask).await.map(|p| p.position())
        });
        while slot.shared.lock().models[0].waiting != 1 {
            tokio::task::yield_now().await;
        }
        drop(held);
        assert_eq!(waiter.await.expect("task").expect("slot"), 0, "its preferred backend's slot");
    }

    #[tokio::test]
    async fn an_excluded_or_drained_backend_is_never_given() {
        let (a, _b, slot) = two(2);
        let ask = Ask { client: client("x"), limit: Duration::MAX, excluded: bit(0), router: None };
        assert_eq!(slot.acquire_with(ask).await.expect("slot").position(), 1);
        a.drain(true);
        assert!(a.status().drained);
        assert_eq!(slot.acquire(client("x")).await.expect("slot").position(), 1);
        a.drain(false);
        assert_eq!(slot.acquire(client("x")).await.expect("slot").position(), 0);
    }

    #[tokio::test]
    async fn one_failed_backend_leaves_the_model_served_and_both_refuse_it() {
        let (a, b, slot) = two(1);
        a.fail("crashed 5 times");
        assert_eq!(slot.acquire(client("x")).await.expect("b serves").position(), 1);
        b.fail("gone");
        let refused = slot.acquire(client("x")).await.err().expect("refused");
        assert!(matches!(refused, GatewayError::BackendFailed { .. }), "{refused:?}");
        assert!(!slot.has_other(0));
    }

    #[tokio::test]
    async fn failures_in_a_row_eject_and_the_other_backend_serves() {
        let (a, _b, slot) = two(1);
        a.set_health_policy(Some(HealthPolicy { request_failures: 2, eject_for: Duration::from_secs(600) }));
        slot.report(0, false);
        assert_eq!(a.status().health, "healthy");
        slot.report(0, false);
        assert_eq!((a.status().health, a.status().ejections), ("ejected", 1));
        assert_eq!(slot.acquire(client("x")).await.expect("slot").position(), 1);
        a.probe_passed();
        assert_eq!(a.status().health, "ejected", "a request's ejection is ended by its trial, not a probe");
        a.probe_failed(Duration::from_secs(600));
        a.probe_passed();
        assert_eq!(a.status().health, "healthy", "a probe's ejection ends with a passing probe");
    }

    #[tokio::test]
    async fn a_new_process_is_told_with_the_backend_position() {
        let (a, b, slot) = two(1);
        let told = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&told);
        slot.on_restart(Arc::new(move |position| seen.lock().expect("lock").push(position)));
        b.close();
        b.open();
        a.close();
        a.open();
        assert_eq!(*told.lock().expect("lock"), [1, 0]);
    }

    #[tokio::test]
    async fn a_stopped_backend_is_not_counted_for_waiters_another_serves() {
        let (a, b, slot) = two(1);
        a.close();
        let _held = slot.acquire(client("x")).await.expect("b");
        let s2 = slot.clone();
        let _waiter = tokio::spawn(async move { s2.acquire(client("y")).await.map(|p| p.position()) });
        while slot.shared.lock().models[0].waiting != 1 {
            tokio::task::yield_now().await;
        }
        assert_eq!(a.view().waiting, 0, "b serves the model: a is not started for it");
        assert_eq!(b.view().waiting, 1);
        b.close();
        assert_eq!(a.view().waiting, 1, "nobody else takes requests: a is needed");
    }
}

/// Found by review (issue 21). A preference longer than what is left of max_wait (the
/// `session` policy's is an hour; cache_aware's is cost(best free) − prefill, minutes for a long
/// prompt) ends in a 503 queue timeout while another backend was free the whole time.
mod reviewed {
    use super::super::*;
    use crate::dispatch::route::{Candidate, Choice, Reason};

    #[tokio::test]
    async fn a_preference_beyond_max_wait_does_not_time_out_while_another_backend_is_free() {
        let pool = Pool::new(Metrics::new(), Arc::new(Notify::new()));
        let a = pool.add_backend("a", 1, true);
        let b = pool.add_backend("b", 1, true);
        let slot = pool.add_model("m", 8, Duration::from_millis(50), &[&a, &b]);
        let held = slot.acquire(ClientId("x".into())).await.expect("slot");
        assert_eq!(held.position(), 0);
        let mut prefer_a = |_: &[Candidate<'_>]| Choice {
            now: None,
            prefer: Some((0, Duration::from_secs(3600))),
            reason: Reason::Session,
        };
        let ask = Ask { client: ClientId("y".into()), limit: Duration::MAX, excluded: 0, router: Some(&mut prefer_a) };
        let got = slot.acquire_with(ask).await.expect("a slot, not a queue timeout");
        assert_eq!(got.position(), 1, "b was free all along");
        assert_eq!(b.view().in_flight, 1);
        drop(got);
        drop(held);
    }
}
