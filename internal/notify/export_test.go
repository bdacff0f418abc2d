package notify

// SetAfterInbox makes c run f inside its transaction right after the inbox
// record; an error from f rolls the transaction back.
func SetAfterInbox(c *Consumer, f func() error) { c.afterInbox = f }
