-- +goose Up

-- products is the global catalog. stock is the units still available; a
-- checkout reserves units in its first transaction and a declined payment
-- gives them back.
CREATE TABLE products (
    sku         text PRIMARY KEY,
    name        text   NOT NULL,
    unit_amount bigint NOT NULL CHECK (unit_amount >= 0), -- minor units
    currency    text   NOT NULL,
    stock       bigint NOT NULL CHECK (stock >= 0)
);

INSERT INTO products (sku, name, unit_amount, currency, stock) VALUES
    ('sku_tee',      'T-shirt',  2500, 'usd', 10000000),
    ('sku_mug',      'Mug',      1200, 'usd', 10000000),
    ('sku_hoodie',   'Hoodie',   5500, 'usd', 10000000),
    ('sku_sold_out', 'Sold out',  900, 'usd', 0);

-- orders: one per checkout. status: pending_payment -> paid | payment_failed.
CREATE TABLE orders (
    id                text PRIMARY KEY,                 -- "ord_…"
    tenant_id         text        NOT NULL,
    status            text        NOT NULL CHECK (status IN ('pending_payment', 'paid', 'payment_failed')),
    email             text        NOT NULL,
    currency          text        NOT NULL,
    amount_total      bigint      NOT NULL CHECK (amount_total >= 0),
    payment_method    text        NOT NULL,
    payment_intent_id text,                             -- "pi_…", set by transaction 2
    payment_status    text,                             -- the PaymentIntent's status
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL
);
CREATE INDEX orders_tenant_created ON orders (tenant_id, created_at);

CREATE TABLE order_items (
    order_id    text    NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    line        integer NOT NULL,
    sku         text    NOT NULL REFERENCES products (sku),
    quantity    integer NOT NULL CHECK (quantity BETWEEN 1 AND 100),
    unit_amount bigint  NOT NULL,
    amount      bigint  NOT NULL,
    PRIMARY KEY (order_id, line)
);

-- idempotency_keys is the authority on what a key has done
-- (draft-ietf-httpapi-idempotency-key-header). A row is created in the same
-- transaction as the order, so it only ever exists at a recovery point from
-- which the request can be resumed.
CREATE TABLE idempotency_keys (
    id               bigserial PRIMARY KEY,
    tenant_id        text        NOT NULL,
    route            text        NOT NULL,             -- method and route template, "POST /v1/checkouts"
    key              text        NOT NULL,             -- the client's Idempotency-Key
    fingerprint      text        NOT NULL,             -- hex SHA-256, see idempotency.Fingerprint
    recovery_point   text        NOT NULL,             -- order_created | finished
    order_id         text,
    lease_owner      text,                             -- token of the process executing it
    lease_expires_at timestamptz,
    response_status  integer,                          -- set when finished
    response_headers jsonb,
    response_body    bytea,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    finished_at      timestamptz,
    expires_at       timestamptz NOT NULL,             -- created_at + IDEMPOTENCY_TTL
    UNIQUE (tenant_id, route, key)
);
-- The completer looks for unfinished keys whose lease expired.
CREATE INDEX idempotency_keys_unfinished ON idempotency_keys (lease_expires_at) WHERE recovery_point <> 'finished';
-- The reaper deletes finished keys past their TTL.
CREATE INDEX idempotency_keys_expires ON idempotency_keys (expires_at) WHERE recovery_point = 'finished';

-- outbox holds events written in the same transaction as the state change
-- (transactional outbox pattern). The relay publishes them and sets
-- published_at; rows are never skipped, whatever order they commit in,
-- because the relay selects by published_at IS NULL rather than by a high-water mark.
CREATE TABLE outbox (
    id              text PRIMARY KEY,                  -- "evt_…", the AMQP message_id
    seq             bigserial   NOT NULL,              -- insertion order, for fair batches
    tenant_id       text        NOT NULL,
    aggregate_id    text        NOT NULL,              -- the order id
    type            text        NOT NULL,              -- routing key: order.created, order.paid, ...
    payload         json        NOT NULL,              -- the message body, kept byte for byte
    occurred_at     timestamptz NOT NULL,
    published_at    timestamptz,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_unpublished ON outbox (next_attempt_at, seq) WHERE published_at IS NULL;
CREATE INDEX outbox_published ON outbox (published_at) WHERE published_at IS NOT NULL;

-- +goose StatementBegin
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Delivered at commit, once per transaction: wakes the relay without polling.
    PERFORM pg_notify('outbox', '');
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- inbox records each message a consumer has processed, written in the same
-- transaction as the consumer's state change (idempotent consumer pattern).
CREATE TABLE inbox (
    consumer    text        NOT NULL,
    message_id  text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX inbox_received ON inbox (received_at);

-- notifications: the durable intent to tell the buyer. The row, not the
-- message, is what the sender works from, so a crash after the ack still sends.
CREATE TABLE notifications (
    id              text PRIMARY KEY,                  -- "ntf_…", part of the email's Message-ID
    order_id        text        NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    tenant_id       text        NOT NULL,
    channel         text        NOT NULL,              -- email
    recipient       text        NOT NULL,
    status          text        NOT NULL CHECK (status IN ('pending', 'sending', 'sent', 'failed')),
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    claimed_until   timestamptz,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    sent_at         timestamptz,
    UNIQUE (order_id, channel)
);
CREATE INDEX notifications_due ON notifications (next_attempt_at) WHERE status IN ('pending', 'sending');

-- +goose Down
DROP TABLE notifications;
DROP TABLE inbox;
DROP TRIGGER outbox_notify ON outbox;
DROP FUNCTION outbox_notify();
DROP TABLE outbox;
DROP TABLE idempotency_keys;
DROP TABLE order_items;
DROP TABLE orders;
DROP TABLE products;
