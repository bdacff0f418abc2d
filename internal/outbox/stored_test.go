package outbox_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
)

// TestForAggregateShowsAnAggregatesEventsInOrder: ForAggregate returns an
// order's events in write order, with their sequence numbers, unpublished,
// and each body the JSON of its Event, sequence included; another order's
// events are not among them.
func TestForAggregateShowsAnAggregatesEventsInOrder(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	for _, e := range []outbox.Event{
		{ID: "evt_1", Type: outbox.TypeOrderCreated, TenantID: "acme", AggregateID: "ord_a", Data: map[string]any{"id": "ord_a"}},
		{ID: "evt_2", Type: outbox.TypeOrderCreated, TenantID: "acme", AggregateID: "ord_b", Data: map[string]any{"id": "ord_b"}},
		{ID: "evt_3", Type: outbox.TypeOrderPaid, TenantID: "acme", AggregateID: "ord_a", Data: map[string]any{"id": "ord_a"}},
	} {
		require.NoError(t, outbox.Add(ctx, db, e))
	}

	got, err := outbox.ForAggregate(ctx, db, "ord_a")
	require.NoError(t, err)
	require.Len(t, got, 2)
	for i, want := range []struct {
		id, typ string
		seq     int64
	}{{"evt_1", outbox.TypeOrderCreated, 1}, {"evt_3", outbox.TypeOrderPaid, 2}} {
		require.Equal(t, want.id, got[i].ID)
		require.Equal(t, want.typ, got[i].Type)
		require.Equal(t, want.seq, got[i].Sequence)
		require.Nil(t, got[i].PublishedAt)
		require.Zero(t, got[i].Attempts)
		var body outbox.Event
		require.NoError(t, json.Unmarshal(got[i].Payload, &body))
		require.Equal(t, want.id, body.ID)
		require.Equal(t, want.seq, body.Sequence)
	}

	none, err := outbox.ForAggregate(ctx, db, "ord_none")
	require.NoError(t, err)
	require.Empty(t, none)
}
