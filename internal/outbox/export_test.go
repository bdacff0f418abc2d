package outbox

import "context"

// SetAfterConfirm makes r run f after the confirms and before marking the
// rows; an error from f rolls the batch back as a crash at that point would.
func SetAfterConfirm(r *Relay, f func(ctx context.Context) error) { r.afterConfirm = f }
