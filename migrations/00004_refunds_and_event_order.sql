-- +goose Up

-- Refunds and the per-order order of events (CONTRACT.md v2, "Refunds" and
-- "Events"; DESIGN.md v2).

-- Per-aggregate event sequence. outbox.Add increments the aggregate's row in
-- the transaction that writes the event: the row lock makes a second
-- transaction of the same order wait until the first commits, so the
-- sequence numbers of one order follow the order in which its events commit.
CREATE TABLE outbox_sequences (
    aggregate_id text   PRIMARY KEY,                   -- the order id
    last_seq     bigint NOT NULL CHECK (last_seq >= 1)
);
ALTER TABLE outbox ADD COLUMN aggregate_seq bigint;    -- 1, 2, … per aggregate; NULL before this migration

-- outbox_next_seq takes the aggregate's next sequence number, locking its
-- counter row until the transaction ends. A function, so that the event's
-- INSERT stays one plain statement (INSERT … SELECT) that can be embedded
-- in a larger one.
-- +goose StatementBegin
CREATE FUNCTION outbox_next_seq(aggregate text) RETURNS bigint LANGUAGE sql VOLATILE AS $$
    INSERT INTO outbox_sequences (aggregate_id, last_seq) VALUES (aggregate, 1)
    ON CONFLICT (aggregate_id) DO UPDATE SET last_seq = outbox_sequences.last_seq + 1
    RETURNING last_seq;
$$;
-- +goose StatementEnd

-- A consumer that applies an aggregate's events in sequence keeps the
-- highest sequence it has applied without a gap (inbox_sequences), and
-- parks an event that arrives before its predecessor (inbox_parked) until
-- the predecessor is applied or the wait ends (package inbox, Admit).
-- Neither counters nor cursors are reaped: one small row per order each,
-- like the order itself. A cursor deleted while its order can still get
-- events (a refund weeks later) would make that event look early: it would
-- wait NOTIFY_SEQUENCE_WAIT and be counted as applied out of order.
CREATE TABLE inbox_sequences (
    consumer     text        NOT NULL,
    aggregate_id text        NOT NULL,
    applied_seq  bigint      NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, aggregate_id)
);
CREATE INDEX inbox_sequences_updated ON inbox_sequences (updated_at);
CREATE TABLE inbox_parked (
    consumer     text        NOT NULL,
    aggregate_id text        NOT NULL,
    seq          bigint      NOT NULL,
    message_id   text        NOT NULL,
    body         bytea       NOT NULL,
    parked_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, aggregate_id, seq)
);
CREATE INDEX inbox_parked_due ON inbox_parked (consumer, parked_at);

-- Order statuses, saga's and refunds' (CONTRACT.md): paid ->
-- partially_refunded -> refunded. Named like 00002's, which it replaces.
ALTER TABLE orders DROP CONSTRAINT IF EXISTS orders_status_check;
ALTER TABLE orders ADD CONSTRAINT orders_status_check CHECK (status IN (
    'pending_payment', 'requires_action', 'payment_unknown', 'paid', 'payment_failed', 'canceled',
    'partially_refunded', 'refunded'));

-- What can still be refunded is amount_total - refund_reserved. Both
-- counters change only in the transaction that changes a refund, under the
-- order's row lock; the CHECK makes the database itself refuse refunds that
-- would add up to more than the order paid, whatever the code above it does.
ALTER TABLE orders
    ADD COLUMN refund_reserved bigint NOT NULL DEFAULT 0, -- pending + succeeded refunds
    ADD COLUMN amount_refunded bigint NOT NULL DEFAULT 0, -- succeeded refunds
    ADD CONSTRAINT orders_refunds_within_total
        CHECK (amount_refunded >= 0 AND amount_refunded <= refund_reserved AND refund_reserved <= amount_total);

-- refunds: one per accepted POST /v1/orders/{id}/refunds. status follows
-- Stripe's refund (docs.stripe.com/api/refunds/object): pending until Stripe
-- says succeeded or failed (canceled counts as failed).
CREATE TABLE refunds (
    id                 text PRIMARY KEY,               -- "rf_…"; Stripe's metadata[refund_id]
    order_id           text        NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    tenant_id          text        NOT NULL,
    idempotency_key_id bigint      UNIQUE,             -- the POST's key row, to resume it
    amount             bigint      NOT NULL CHECK (amount > 0),
    currency           text        NOT NULL,
    reason             text,                           -- requested_by_customer | duplicate | fraudulent
    status             text        NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed')),
    payment_intent_id  text        NOT NULL,
    stripe_refund_id   text        UNIQUE,             -- "re_…", once Stripe answered
    stripe_status      text,                           -- Stripe's own status, e.g. requires_action
    failure_reason     text,
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,
    settled_at         timestamptz
);
CREATE INDEX refunds_order ON refunds (order_id, created_at);
-- The refund reconciler polls Stripe for refunds still pending there.
CREATE INDEX refunds_pending ON refunds (updated_at) WHERE status = 'pending';

-- The saga's step log (00002 creates it; this is the same table, for a
-- branch where 00002 is not there yet). A refund's steps are
-- "refund:{refund id}".
CREATE TABLE IF NOT EXISTS payment_attempts (
    id                bigserial   PRIMARY KEY,
    order_id          text        NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    tenant_id         text        NOT NULL,
    step              text        NOT NULL,
    attempt           integer     NOT NULL CHECK (attempt >= 1),
    idempotency_key   text        NOT NULL UNIQUE,
    payment_intent_id text,
    request_params    jsonb       NOT NULL,
    outcome           text        CHECK (outcome IN ('succeeded', 'failed', 'indeterminate', 'rejected')),
    stripe_object_id  text,
    stripe_status     text,
    error             text,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    UNIQUE (order_id, step, attempt)
);

-- Notifications say what they are about: the order's payment, or one of its
-- refunds (one email per succeeded refund). event_seq is the sequence of the
-- event that created the row; the sender sends one order's emails in that
-- order.
ALTER TABLE notifications
    ADD COLUMN kind      text NOT NULL DEFAULT 'order_paid' CHECK (kind IN ('order_paid', 'order_refunded')),
    ADD COLUMN refund_id text,
    ADD COLUMN event_seq bigint;
ALTER TABLE notifications DROP CONSTRAINT notifications_order_id_channel_key;
CREATE UNIQUE INDEX notifications_once ON notifications (order_id, channel, kind, (coalesce(refund_id, '')));
CREATE INDEX notifications_order_seq ON notifications (order_id, event_seq) WHERE status IN ('pending', 'sending');

-- +goose Down
DROP INDEX notifications_order_seq;
DROP INDEX notifications_once;
ALTER TABLE notifications ADD CONSTRAINT notifications_order_id_channel_key UNIQUE (order_id, channel);
ALTER TABLE notifications DROP COLUMN kind, DROP COLUMN refund_id, DROP COLUMN event_seq;
DROP TABLE refunds;
ALTER TABLE orders DROP CONSTRAINT orders_refunds_within_total,
    DROP COLUMN refund_reserved, DROP COLUMN amount_refunded;
ALTER TABLE orders DROP CONSTRAINT orders_status_check;
ALTER TABLE orders ADD CONSTRAINT orders_status_check CHECK (status IN (
    'pending_payment', 'requires_action', 'payment_unknown', 'paid', 'payment_failed', 'canceled'));
DROP TABLE inbox_parked;
DROP TABLE inbox_sequences;
DROP FUNCTION outbox_next_seq(text);
ALTER TABLE outbox DROP COLUMN aggregate_seq;
DROP TABLE outbox_sequences;
