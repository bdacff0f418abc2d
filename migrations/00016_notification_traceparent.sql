-- +goose Up

-- traceparent is the W3C traceparent of the worker's consume span that
-- created the notification (internal/tracing), NULL when tracing was off:
-- the SMTP send is its child, so the email joins the checkout's trace.
-- Owner: notify.
ALTER TABLE notifications ADD COLUMN traceparent text;

-- +goose Down
ALTER TABLE notifications DROP COLUMN traceparent;
