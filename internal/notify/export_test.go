package notify

// SetAfterInbox makes c run f inside its transaction right after the inbox
// record; an error from f rolls the transaction back.
func SetAfterInbox(c *Consumer, f func() error) { c.afterInbox = f }

// BreakIdleSessions closes the connections of m's idle sessions under
// them, as a server that dropped idle clients would, leaving them idle.
func BreakIdleSessions(m *SMTPMailer) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.idle {
		s.conn.Close()
	}
	return len(m.idle)
}

// SetServiceAfterInbox is SetAfterInbox on the consumer of s.
func SetServiceAfterInbox(s *Service, f func() error) { s.handler.afterInbox = f }
