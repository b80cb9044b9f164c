from examples.approved_refund.agent import build_agent
from examples.payments import LocalProvider
from tenxgraph import Message, Resume

payments = LocalProvider()
app = build_agent(payments=payments)
config = {"thread_id": "ticket-1042"}
result = app.invoke({"messages": [Message.text_message("refund orders 1042 and 1043")]}, config)
print(result.status, [(i.tool, i.args) for i in result.interrupts])  # interrupted: 1042's refund waits
result = app.invoke(Resume({result.interrupts[0].id: True}), config)  # a supervisor approves
print(result.status, result.final_text, payments.effects)
