-- +goose Up

-- traceparent is the W3C traceparent of the worker's consume span of a
-- parked event (internal/tracing), NULL when tracing was off: the event is
-- applied later, by its predecessor's delivery or by the release of
-- overdue events, and its notification must still join the trace of the
-- event, not the trace of whatever applied it (issue 38: an order.paid
-- that overtook its order.created sent its email outside the checkout's
-- trace). Owner: inbox.
ALTER TABLE inbox_parked ADD COLUMN traceparent text;

-- +goose Down
ALTER TABLE inbox_parked DROP COLUMN traceparent;
