-- +goose Up

-- traceparent is the W3C Trace Context traceparent of the span that wrote
-- the event (internal/tracing), NULL when tracing was off. The dispatcher
-- publishes the event as that span's child and carries its own
-- traceparent in the AMQP headers, so one checkout is one trace across the
-- processes. Owner: outbox.
ALTER TABLE outbox ADD COLUMN traceparent text;

-- +goose Down
ALTER TABLE outbox DROP COLUMN traceparent;
