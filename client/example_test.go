package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/onceonly/checkout/client"
)

// The key is made once for the purchase and kept until a final answer;
// the client sends it on every retry. Here the api's first answer is lost
// (a 503), the retry gets the paid order.
func ExampleClient_CreateCheckout() {
	answers := 0
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answers++
		if answers == 1 {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"type":"about:blank","title":"Unavailable","status":503,"code":"unavailable"}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, orderJSON)
	}))
	defer api.Close()

	c, err := client.New(api.URL, "sk_test_acme")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := client.NewKey()
	r, err := c.CreateCheckout(ctx, key, client.CheckoutRequest{
		Email: "buyer@example.com", PaymentMethod: "pm_card_visa",
		Items: []client.Item{{SKU: "sku_tee", Quantity: 2}},
	})
	var e *client.Error
	switch {
	case err == nil:
		fmt.Println(r.StatusCode, r.Order.Status, r.Order.AmountTotal, "after", r.Attempts, "attempts")
	case errors.As(err, &e) && e.Temporary():
		fmt.Println("still open: try again later with key", e.IdempotencyKey)
	case client.IsCode(err, client.CodeCardDeclined):
		fmt.Println("declined: order", e.OrderID)
	default:
		fmt.Println("refused:", err) // e.Code, e.Status, e.Detail when errors.As found an *Error
	}
	// Output: 201 paid 5000 after 2 attempts
}
