package rabbitmq

import (
	"errors"
	"fmt"
)

// Settings are the environment variables that name the broker and the
// topology (CONTRACT.md, "Configuration"), which the dispatcher and the
// worker share: each embeds them in its own settings beside
// config.Shared (internal/config reads them: env tags, no import).
type Settings struct {
	// AMQPURL is one AMQP URI or a comma-separated list of a cluster's
	// nodes (ParseURLs).
	AMQPURL string `env:"AMQP_URL" envDefault:"amqp://guest:guest@127.0.0.1:5672/"`
	// Exchange and NotifyQueue name the topology; the dead-letter queue is
	// NotifyQueue + ".dlq" (DeadLetterQueueOf). Tests set them to names of
	// their own.
	Exchange    string `env:"AMQP_EXCHANGE" envDefault:"checkout.events"`
	NotifyQueue string `env:"NOTIFY_QUEUE" envDefault:"notify.order_paid"`
}

// Check validates what parsing cannot; each error names its variable.
func (s *Settings) Check() []error {
	var errs []error
	if _, err := ParseURLs(s.AMQPURL); err != nil {
		errs = append(errs, fmt.Errorf("AMQP_URL: %w", err))
	}
	if s.Exchange == "" || s.NotifyQueue == "" {
		errs = append(errs, errors.New("AMQP_EXCHANGE, NOTIFY_QUEUE: must not be empty"))
	}
	return errs
}

// Names is the topology the process declares: DefaultNames with the
// exchange and the queues s names.
func (s *Settings) Names() Names {
	n := DefaultNames()
	n.Exchange = s.Exchange
	n.NotifyQueue = s.NotifyQueue
	n.NotifyDLQ = DeadLetterQueueOf(s.NotifyQueue)
	return n
}
