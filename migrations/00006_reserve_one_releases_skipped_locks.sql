-- +goose Up

-- reserve_one's first step in a subtransaction (see its comment): two
-- checkouts of the last units of a hot sku could deadlock, each holding a
-- bucket the other waited for (TestStockReservationsNeverDeadlock).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION reserve_one(p_sku text, p_qty bigint) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    b     smallint;
    r     record;
    total bigint := 0;
    need  bigint;
BEGIN
    -- 1. A bucket that covers the quantity and that no transaction in
    -- flight holds: taken without waiting. A subtransaction, like step 2:
    -- FOR UPDATE locks a bucket that a commit since this statement's
    -- snapshot left short of the quantity before it rechecks and skips it,
    -- and the lock stays. Rolled back, it is given back before steps 2 and
    -- 3 wait for other buckets, or two checkouts could each hold what the
    -- other waits for (ExecLockRows in src/backend/executor/nodeLockRows.c
    -- locks a row before it rechecks the row's quals, and one that fails
    -- them is skipped, not unlocked).
    BEGIN
        UPDATE stock_buckets SET stock = stock - p_qty
        WHERE sku = p_sku AND bucket = (
            SELECT bucket FROM stock_buckets
            WHERE sku = p_sku AND stock >= p_qty
            ORDER BY bucket LIMIT 1
            FOR UPDATE SKIP LOCKED)
        RETURNING bucket INTO b;
        IF FOUND THEN
            RETURN true;
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'CKB03';
    EXCEPTION WHEN SQLSTATE 'CKB03' THEN
        NULL;
    END;

    -- 2. Every such bucket is held by a checkout in flight: wait for one of
    -- them (a random one, so waiters spread), and take it if it still
    -- covers the quantity once its holder commits. The block is a
    -- subtransaction: when the bucket no longer covers the quantity, the
    -- lock taken while waiting is given back before step 3 locks in order.
    SELECT bucket INTO b FROM stock_buckets
    WHERE sku = p_sku AND stock >= p_qty ORDER BY random() LIMIT 1;
    IF FOUND THEN
        BEGIN
            UPDATE stock_buckets SET stock = stock - p_qty
            WHERE sku = p_sku AND bucket = b AND stock >= p_qty;
            IF FOUND THEN
                RETURN true;
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'CKB01';
        EXCEPTION WHEN SQLSTATE 'CKB01' THEN
            NULL;
        END;
    END IF;

    -- 3. No bucket covers the quantity alone: lock them all, in bucket
    -- order, and take it from several if together they hold enough.
    FOR r IN SELECT stock FROM stock_buckets WHERE sku = p_sku ORDER BY bucket FOR UPDATE LOOP
        total := total + r.stock;
    END LOOP;
    IF total < p_qty THEN
        RETURN false;
    END IF;
    need := p_qty;
    FOR r IN SELECT bucket, stock FROM stock_buckets WHERE sku = p_sku AND stock > 0 ORDER BY stock DESC, bucket LOOP
        UPDATE stock_buckets SET stock = stock - least(need, r.stock) WHERE sku = p_sku AND bucket = r.bucket;
        need := need - least(need, r.stock);
        EXIT WHEN need = 0;
    END LOOP;
    RETURN true;
END;
$$;
-- +goose StatementEnd

-- +goose Down

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION reserve_one(p_sku text, p_qty bigint) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    b     smallint;
    r     record;
    total bigint := 0;
    need  bigint;
BEGIN
    -- 1. A bucket that covers the quantity and that no transaction in
    -- flight holds: taken without waiting.
    UPDATE stock_buckets SET stock = stock - p_qty
    WHERE sku = p_sku AND bucket = (
        SELECT bucket FROM stock_buckets
        WHERE sku = p_sku AND stock >= p_qty
        ORDER BY bucket LIMIT 1
        FOR UPDATE SKIP LOCKED)
    RETURNING bucket INTO b;
    IF FOUND THEN
        RETURN true;
    END IF;

    -- 2. Every such bucket is held by a checkout in flight: wait for one of
    -- them (a random one, so waiters spread), and take it if it still
    -- covers the quantity once its holder commits. The block is a
    -- subtransaction: when the bucket no longer covers the quantity, the
    -- lock taken while waiting is given back before step 3 locks in order.
    SELECT bucket INTO b FROM stock_buckets
    WHERE sku = p_sku AND stock >= p_qty ORDER BY random() LIMIT 1;
    IF FOUND THEN
        BEGIN
            UPDATE stock_buckets SET stock = stock - p_qty
            WHERE sku = p_sku AND bucket = b AND stock >= p_qty;
            IF FOUND THEN
                RETURN true;
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'CKB01';
        EXCEPTION WHEN SQLSTATE 'CKB01' THEN
            NULL;
        END;
    END IF;

    -- 3. No bucket covers the quantity alone: lock them all, in bucket
    -- order, and take it from several if together they hold enough.
    FOR r IN SELECT stock FROM stock_buckets WHERE sku = p_sku ORDER BY bucket FOR UPDATE LOOP
        total := total + r.stock;
    END LOOP;
    IF total < p_qty THEN
        RETURN false;
    END IF;
    need := p_qty;
    FOR r IN SELECT bucket, stock FROM stock_buckets WHERE sku = p_sku AND stock > 0 ORDER BY stock DESC, bucket LOOP
        UPDATE stock_buckets SET stock = stock - least(need, r.stock) WHERE sku = p_sku AND bucket = r.bucket;
        need := need - least(need, r.stock);
        EXIT WHEN need = 0;
    END LOOP;
    RETURN true;
END;
$$;
-- +goose StatementEnd
