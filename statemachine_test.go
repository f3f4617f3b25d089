package idem_test

import (
	"fmt"

	"github.com/idemkit/idem"
)

// A machine renders itself for documentation.
func ExampleStateMachine_Mermaid() {
	m, err := idem.NewStateMachine(idem.StateMachineConfig{
		Table: "orders", IDColumn: "id", StateColumn: "status",
		States: []string{"PENDING", "PAID", "SHIPPED", "CANCELLED", "REFUNDED"},
		Transitions: map[string][]string{
			"PENDING": {"PAID", "CANCELLED"},
			"PAID":    {"SHIPPED", "REFUNDED"},
			"SHIPPED": {"REFUNDED"},
		},
	})
	if err != nil {
		panic(err)
	}
	fmt.Print(m.Mermaid())
	// Output:
	// stateDiagram-v2
	//     PENDING --> CANCELLED
	//     PENDING --> PAID
	//     PAID --> REFUNDED
	//     PAID --> SHIPPED
	//     SHIPPED --> REFUNDED
}
