-- +goose Up

-- dead_letters records every event the notification worker dead-lettered
-- (CONTRACT.md v4, "Events"): the worker's consumer of the dead-letter
-- queue writes one row per message and queue while it is unresolved, then
-- acknowledges the broker's copy, so the dead-letter queue is never where
-- an event waits unseen. `worker redrive-dead-letters` sends a row's event
-- to its queue again and sets redriven_at. Owned by internal/deadletter.
CREATE TABLE dead_letters (
    id              text PRIMARY KEY,
    queue           text NOT NULL,         -- the queue it was dead-lettered from
    message_id      text NOT NULL,
    routing_key     text NOT NULL,         -- as first published: the event type
    content_type    text NOT NULL DEFAULT '',
    reason          text NOT NULL,         -- deadletter.Reason
    last_error      text NOT NULL DEFAULT '',
    failures        integer NOT NULL,      -- handler failures when it was dead-lettered
    times           integer NOT NULL DEFAULT 1, -- dead-letterings recorded while unresolved
    headers         jsonb NOT NULL DEFAULT '{}',
    body            bytea NOT NULL,
    first_dead_at   timestamptz NOT NULL,
    last_dead_at    timestamptz NOT NULL,
    redriven_at     timestamptz
);

-- One unresolved row per message and queue: a message dead-lettered again
-- before it is sent again adds to times.
CREATE UNIQUE INDEX dead_letters_unresolved ON dead_letters (queue, message_id) WHERE redriven_at IS NULL;

-- +goose Down
DROP TABLE IF EXISTS dead_letters;
