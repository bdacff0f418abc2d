-- +goose Up

-- batch_guard is how one statement of a batch (postgres.Batch: several
-- statements sent in one round trip, run as one implicit transaction)
-- stops the whole batch when it cannot do what it is there for: ok false
-- (or NULL) raises SQLSTATE CKG01 with p_guard as the error's constraint
-- name, PostgreSQL skips the statements after it and rolls back the ones
-- before it, and Go tells which guard failed from the name
-- (postgres.IsGuard). Each table's owner queues its own statements and
-- names its own guards, so no SQL is shared across packages to make one
-- statement of several tables' writes.
-- +goose StatementBegin
CREATE FUNCTION batch_guard(p_ok boolean, p_guard text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF p_ok IS NOT TRUE THEN
        RAISE EXCEPTION 'batch guard % failed', p_guard USING ERRCODE = 'CKG01', CONSTRAINT = p_guard;
    END IF;
    RETURN true;
END;
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION batch_guard(boolean, text);
